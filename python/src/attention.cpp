// python/src/attention.cpp: tileattn._C's dense and variable-length forward and backward:
// each array seen in place (arrays.hpp), the element type resolved from q, the GIL released
// while the kernel runs.
#include "bindings.hpp"

#include <nanobind/stl/optional.h>

#include "dispatch.hpp"
#include "options.hpp"
#include "views.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/forward.hpp"

namespace tileattn::python {

namespace {

void forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& o, const OptionalOut& lse,
             const Options& options) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const ForwardViews<T, 4> a(q, k, v, o, lse);
    const ForwardOptions f = forward_options(options);
    nb::gil_scoped_release release;
    tileattn::forward(a.q, a.k, a.v, a.o, a.lse, f);
  });
}

void backward(const InArray& q, const InArray& k, const InArray& v, const InArray& o, const InArray& lse,
              const InArray& dout, const OutArray& dq, const OutArray& dk, const OutArray& dv, const Options& options) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const BackwardViews<T, 4> a(q, k, v, o, lse, dout, dq, dk, dv);
    const BackwardOptions b = backward_options(options);
    nb::gil_scoped_release release;
    tileattn::backward(a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv, b);
  });
}

VarlenSequences sequences(const InArray& cu_seqlens_q, const InArray& cu_seqlens_k, index_t max_seqlen_q,
                          index_t max_seqlen_k) {
  const std::optional<InArray> cq = cu_seqlens_q, ck = cu_seqlens_k;
  return {span_of<const std::int32_t>(cq, "cu_seqlens_q"), span_of<const std::int32_t>(ck, "cu_seqlens_k"),
          max_seqlen_q, max_seqlen_k};
}

void forward_varlen(const InArray& q, const InArray& k, const InArray& v, const OutArray& o, const OptionalOut& lse,
                    const InArray& cu_seqlens_q, const InArray& cu_seqlens_k, index_t max_seqlen_q,
                    index_t max_seqlen_k, const Options& options) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const ForwardViews<T, 3> a(q, k, v, o, lse);
    const VarlenSequences seqs = sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    const ForwardOptions f = forward_options(options);
    nb::gil_scoped_release release;
    tileattn::forward_varlen(a.q, a.k, a.v, a.o, a.lse, seqs, f);
  });
}

void backward_varlen(const InArray& q, const InArray& k, const InArray& v, const InArray& o, const InArray& lse,
                     const InArray& dout, const OutArray& dq, const OutArray& dk, const OutArray& dv,
                     const InArray& cu_seqlens_q, const InArray& cu_seqlens_k, index_t max_seqlen_q,
                     index_t max_seqlen_k, const Options& options) {
  with_storage_type(q, "q", [&](auto t) {
    using T = decltype(t);
    const BackwardViews<T, 3> a(q, k, v, o, lse, dout, dq, dk, dv);
    const VarlenSequences seqs = sequences(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
    const BackwardOptions b = backward_options(options);
    nb::gil_scoped_release release;
    tileattn::backward_varlen(a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv, seqs, b);
  });
}

}  // namespace

void bind_attention(nb::module_& m) {
  using namespace nb::literals;
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "options"_a,
        "O = attention(Q, K, V) over [batch, seqlen, heads, head_dim] arrays (any strides); lse "
        "[batch, heads_q, seqlen_q] float32 or None.");
  m.def("backward", &backward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a, "options"_a,
        "dQ, dK, dV of a forward() that ran with the same options.");
  m.def("forward_varlen", &forward_varlen, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "cu_seqlens_q"_a,
        "cu_seqlens_k"_a, "max_seqlen_q"_a, "max_seqlen_k"_a, "options"_a,
        "forward() over packed [total, heads, head_dim] sequences; lse [heads_q, total_q].");
  m.def("backward_varlen", &backward_varlen, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a,
        "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a, "max_seqlen_k"_a, "options"_a,
        "backward() of forward_varlen().");
}

}  // namespace tileattn::python
