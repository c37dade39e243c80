// The control: a backward_flex whose score_mod gives its derivative, and a forward_flex whose
// score_mod has none (the forward needs none), compile with the same flags, so the failures
// beside it come from the checks, not from the set-up.
#include "common.hpp"
using namespace flex_case;
void call() {
  auto mod = tileattn::flex::with_grad{[](float s, index_t, index_t, index_t, index_t) { return 2.0f * s; },
                                       [](float, index_t, index_t, index_t, index_t) { return 2.0f; }};
  tileattn::forward_flex(view(), view(), view(), view(), lse(), mod, tileattn::flex::causal{});
  auto plain = [](float s, index_t, index_t, index_t, index_t) { return 2.0f * s; };
  tileattn::forward_flex(view(), view(), view(), view(), lse(), plain, tileattn::flex::causal{});
  tileattn::backward_flex(view(), view(), view(), view(), lse(), view(), view(), view(), view(), mod,
                          tileattn::flex::causal{});
}
