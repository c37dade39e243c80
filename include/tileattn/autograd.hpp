// tileattn/autograd.hpp: a small layer for programs that write their own autograd: an
// attention "function" object whose forward() runs tileattn::forward and keeps what the
// backward needs (the views of Q, K, V and O, and the log-sum-exp, which it owns), and
// whose backward() turns dO into dQ, dK, dV with the same options.
//
//   tileattn::Attention<float> attn(options);        // BackwardOptions: causal, sinks, ...
//   attn.forward(q, k, v, o);                        // o = attention(q, k, v)
//   ... loss ... dout
//   attn.backward(dout, dq, dk, dv);                 // q, k, v, o must be unchanged since
//
// The object does not copy Q, K, V or O: they must stay alive and unmodified between the
// two calls (as the tensors an autograd tape saves).
#pragma once

#include <utility>
#include <vector>

#include "tileattn/backward.hpp"
#include "tileattn/core/error.hpp"
#include "tileattn/forward.hpp"

namespace tileattn {

template <class T>
class Attention {
 public:
  explicit Attention(BackwardOptions options = {}) : options_(std::move(options)) {}

  /// o = attention(q, k, v) under the options; saves the views and the LSE for backward().
  void forward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<T> o) {
    saved_ = false;
    lse_.assign(static_cast<std::size_t>(q.shape[dim::batch] * q.shape[dim::heads] * q.shape[dim::seqlen]), 0.0f);
    tileattn::forward(q, k, v, o, make_lse(lse_.data(), q.shape[dim::batch], q.shape[dim::heads], q.shape[dim::seqlen]),
                      options_);
    q_ = q;
    k_ = k;
    v_ = v;
    o_ = o;
    saved_ = true;
  }

  /// dq, dk, dv from dO for the last forward() (options.dsinks / dbias, when set, too).
  void backward(TensorView<const T> dout, TensorView<T> dq, TensorView<T> dk, TensorView<T> dv) const {
    TILEATTN_REQUIRE(saved_, "backward", "called before a successful forward()");
    tileattn::backward(q_, k_, v_, o_, lse(), dout, dq, dk, dv, options_);
  }

  /// The options both passes use; set dsinks or dbias here before backward().
  BackwardOptions& options() { return options_; }
  /// The last forward's log-sum-exp, [batch, heads, seqlen_q].
  SavedLseView lse() const {
    return {lse_.data(), {q_.shape[dim::batch], q_.shape[dim::heads], q_.shape[dim::seqlen]},
            {q_.shape[dim::heads] * q_.shape[dim::seqlen], q_.shape[dim::seqlen], 1}};
  }

 private:
  BackwardOptions options_;
  std::vector<float> lse_;
  TensorView<const T> q_, k_, v_, o_;
  bool saved_ = false;
};

}  // namespace tileattn
