// tileattn/detail/backward_checks.hpp: the backward entry points' argument checks beyond the
// forward's: O, dO, the saved LSE and the gradients' shapes, the extra gradient outputs
// (dsinks, dbias), and that no output aliases an input or another output. All run before
// any work starts, so a bad argument throws (naming it) with nothing written.
#pragma once

#include <string>

#include "tileattn/core/params.hpp"
#include "tileattn/detail/forward_checks.hpp"
#include "tileattn/detail/view_checks.hpp"

namespace tileattn::detail {

/// `view` must have exactly the extents of `like` (a gradient or dO against its tensor).
template <class A, class B, int R>
void check_like(const StridedView<A, R>& view, const std::string& name, const StridedView<B, R>& like,
                const std::string& like_name, const QkvLayout<R>& layout, bool may_be_empty) {
  EmptyExtents<R> empty{};
  if (may_be_empty) empty[static_cast<std::size_t>(layout.seqlen)] = true;
  check_view(view, name, layout.names, empty);
  for (std::size_t d = 0; d < R; ++d) check_same_extent(like, like_name, view, name, d, layout.names[d]);
}

/// q, k, v and o as the forward checks them (o read-only here), dO like o, dQ like q, dK
/// like k, dV like v.
template <class T, int R>
void check_backward_views(const StridedView<const T, R>& q, const StridedView<const T, R>& k,
                          const StridedView<const T, R>& v, const StridedView<const T, R>& o,
                          const StridedView<const T, R>& dout, const StridedView<T, R>& dq,
                          const StridedView<T, R>& dk, const StridedView<T, R>& dv,
                          const QkvLayout<R>& layout) {
  const StridedView<T, R> o_checked{const_cast<T*>(o.data), o.shape, o.stride};  // only read
  check_qkvo(q, k, v, o_checked, layout);
  const bool packed = layout.batch < 0;  // varlen: an extent of 0 is an empty batch
  check_like(dout, "dout", o, "o", layout, packed);
  check_like(dq, "dq", q, "q", layout, packed);
  check_like(dk, "dk", k, "k", layout, packed);
  check_like(dv, "dv", v, "v", layout, packed);
}

/// dsinks needs sinks and one entry per query head; dbias needs a bias and its exact shape.
template <class T>
void check_extra_gradients(const BackwardParams<T>& p) {
  if (!p.dsinks.empty()) {
    TILEATTN_REQUIRE(!p.sinks.empty(), "dsinks", "is set but options.sinks is empty (no sinks to differentiate)");
    TILEATTN_REQUIRE(static_cast<index_t>(p.dsinks.size()) == p.heads(), "dsinks",
            "needs heads_q = " + std::to_string(p.heads()) + " entries, got " + std::to_string(p.dsinks.size()));
  }
  if (!p.dbias.data) return;
  TILEATTN_REQUIRE(p.bias.data != nullptr, "dbias", "is set but options.bias is not (no bias to differentiate)");
  check_view(p.dbias, "dbias", score_dims, {false, false, true, true});
  for (std::size_t d = 0; d < 4; ++d)
    TILEATTN_REQUIRE(p.dbias.shape[d] == p.bias.shape[d], dim_name("dbias", "shape", d, score_dims[d]),
            "must equal bias.shape[" + std::to_string(d) + "] = " + std::to_string(p.bias.shape[d]) + ", got " +
                std::to_string(p.dbias.shape[d]));
}

/// An output of the backward must not overlap itself, any input, or an earlier output.
template <class T, class Out>
void check_backward_output(const BackwardParams<T>& p, const Out& out, const std::string& name) {
  check_output(p, out, name);  // itself, q, k, v, bias, mask
  check_disjoint(out, name, p.out, "o");
  check_disjoint(out, name, p.dout, "dout");
  check_disjoint(out, name, p.saved_lse, "lse");
  if (!p.sinks.empty()) check_disjoint(out, name, array_view(p.sinks), "sinks");
  if (!p.alibi_slopes.empty()) check_disjoint(out, name, array_view(p.alibi_slopes), "alibi_slopes");
}

template <class T>
void check_backward_aliasing(const BackwardParams<T>& p) {
  check_backward_output(p, p.dq, "dq");
  check_backward_output(p, p.dk, "dk");
  check_disjoint(p.dk, "dk", p.dq, "dq");
  check_backward_output(p, p.dv, "dv");
  check_disjoint(p.dv, "dv", p.dq, "dq");
  check_disjoint(p.dv, "dv", p.dk, "dk");
  const StridedView<float, 1> dsinks{p.dsinks.data(), {static_cast<index_t>(p.dsinks.size())}, {1}};
  if (!p.dsinks.empty()) {
    check_backward_output(p, dsinks, "dsinks");
    check_disjoint(dsinks, "dsinks", p.dq, "dq");
    check_disjoint(dsinks, "dsinks", p.dk, "dk");
    check_disjoint(dsinks, "dsinks", p.dv, "dv");
  }
  if (p.dbias.data) {
    check_backward_output(p, p.dbias, "dbias");
    check_disjoint(p.dbias, "dbias", p.dq, "dq");
    check_disjoint(p.dbias, "dbias", p.dk, "dk");
    check_disjoint(p.dbias, "dbias", p.dv, "dv");
    if (!p.dsinks.empty()) check_disjoint(p.dbias, "dbias", dsinks, "dsinks");
  }
}

}  // namespace tileattn::detail
