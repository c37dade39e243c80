// A mask_mod that does not take (b, h, q_idx, kv_idx).
#include "common.hpp"
using namespace flex_case;
void call() {
  auto mask = [](index_t q, index_t kv) { return kv <= q; };
  tileattn::forward_flex(view(), view(), view(), view(), lse(), tileattn::flex::no_score_mod{}, mask);
}
