// A score_mod with no derivative cannot be differentiated: backward_flex rejects it at
// compile time rather than treating its derivative as 1.
#include "common.hpp"
using namespace flex_case;
void call() {
  auto mod = [](float s, index_t, index_t, index_t, index_t) { return 2.0f * s; };
  tileattn::backward_flex(view(), view(), view(), view(), lse(), view(), view(), view(), view(), mod,
                          tileattn::flex::causal{});
}
