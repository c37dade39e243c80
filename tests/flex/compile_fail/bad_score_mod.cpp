// A score_mod that does not take (score, b, h, q_idx, kv_idx).
#include "common.hpp"
using namespace flex_case;
void call() {
  auto mod = [](float s, index_t q, index_t kv) { return s + float(q - kv); };
  tileattn::forward_flex(view(), view(), view(), view(), lse(), mod, tileattn::flex::causal{});
}
