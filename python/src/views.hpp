// python/src/views.hpp: the views of a forward's and a backward's arrays, taken together (each
// named for its errors), so that every entry point of the extension reads them one way.
// R is 4 for [batch, seqlen, heads, dim] tensors, 3 for packed varlen ones.
#pragma once

#include "arrays.hpp"

namespace tileattn::python {

/// q, k, v read; o written; lse written when given ([batch, heads, seqlen] or [heads, total]).
template <class T, int R>
struct ForwardViews {
  StridedView<const T, R> q, k, v;
  StridedView<T, R> o;
  StridedView<float, R - 1> lse;

  ForwardViews(const InArray& q_, const InArray& k_, const InArray& v_, const OutArray& o_, const OptionalOut& lse_)
      : q(view_of<const T, R>(q_, "q")),
        k(view_of<const T, R>(k_, "k")),
        v(view_of<const T, R>(v_, "v")),
        o(view_of<T, R>(o_, "o")),
        lse(view_of<float, R - 1>(lse_, "lse")) {}
};

/// The forward's q, k, v, o and lse read, dout read, dq, dk, dv written.
template <class T, int R>
struct BackwardViews {
  StridedView<const T, R> q, k, v, o;
  StridedView<const float, R - 1> lse;
  StridedView<const T, R> dout;
  StridedView<T, R> dq, dk, dv;

  BackwardViews(const InArray& q_, const InArray& k_, const InArray& v_, const InArray& o_, const InArray& lse_,
                const InArray& dout_, const OutArray& dq_, const OutArray& dk_, const OutArray& dv_)
      : q(view_of<const T, R>(q_, "q")),
        k(view_of<const T, R>(k_, "k")),
        v(view_of<const T, R>(v_, "v")),
        o(view_of<const T, R>(o_, "o")),
        lse(view_of<const float, R - 1>(lse_, "lse")),
        dout(view_of<const T, R>(dout_, "dout")),
        dq(view_of<T, R>(dq_, "dq")),
        dk(view_of<T, R>(dk_, "dk")),
        dv(view_of<T, R>(dv_, "dv")) {}
};

}  // namespace tileattn::python
