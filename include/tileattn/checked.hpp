// tileattn/checked.hpp: internal (users call forward(), backward(), merge_states()): the
// checked, type-resolved entry functions beneath the public calls, named for the code built
// on top of them (distributed/ring.hpp), so that it needs nothing from tileattn::detail.
//
// The public calls resolve their element types and hand their views to these; each checks
// every argument before anything runs, as the public call documents. They are the same
// functions (using-declarations), so the explicit instantiations cover both.
#pragma once

#include "tileattn/backward.hpp"
#include "tileattn/forward.hpp"
#include "tileattn/merge_states.hpp"

namespace tileattn::checked {

// The element types forward() and backward() accept (compile-time checks).
using tileattn::detail::check_backward_element_types;
using tileattn::detail::check_element_types;

// Every check forward() and backward() make of their arguments, and the params they give
// (how a caller validates its arguments before it runs anything).
using tileattn::detail::checked_backward_params;
using tileattn::detail::checked_params;

// forward(), backward() and merge_states() after their element types are resolved.
using tileattn::detail::backward;
using tileattn::detail::forward;
using tileattn::detail::merge_states;

// The exact paths for large scores (distributed/ring.hpp runs them per chunk pair): a
// forward that gives each row's statistics (for an exact merge), which saved LSE is too
// coarse to recompute P from, and the statistics the backward takes P from instead.
using tileattn::detail::backward_fp32_gradients;
using tileattn::detail::backward_row_stats;
using tileattn::detail::forward_row_stats;
using tileattn::detail::large_lse;

// The softmax scale forward() uses when the options leave it unset (1 / sqrt(head_dim)).
using tileattn::detail::default_scale;

}  // namespace tileattn::checked
