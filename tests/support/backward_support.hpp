// tests/support/backward_support.hpp: a backward problem for the backward suites: random
// Q, K, V, dO (N(0, 1), seeded, in a chosen storage type and memory layout), the kernel's
// forward and backward on them, the double-precision reference gradients, and the error
// metric of FlashAttention's rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_backward.hpp"
#include "support/test_support.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {

struct ProblemShape {
  index_t batch = 1, seqlen_q = 0, seqlen_k = 0, heads = 1, heads_kv = 1, head_dim = 0, head_dim_v = 0;
};

/// One backward problem in storage type T: inputs (rounded to T), and the kernel's outputs
/// as floats in the reference's contiguous layouts.
template <class T>
struct BackwardProblem {
  ProblemShape s;
  Layout layout;
  std::vector<T> q, k, v, o, dout, dq, dk, dv;  // buffers in `layout`
  TensorView<T> qv, kv, vv, ov, dov, dqv, dkv, dvv;
  std::vector<float> lse;

  BackwardProblem(ProblemShape shape, std::uint64_t seed, Layout l = Layout::bshd) : s(shape), layout(l) {
    make(q, qv, {s.batch, s.seqlen_q, s.heads, s.head_dim}, seed);
    make(k, kv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, seed + 1);
    make(v, vv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v}, seed + 2);
    make(dout, dov, {s.batch, s.seqlen_q, s.heads, s.head_dim_v}, seed + 3);
    make(o, ov, {s.batch, s.seqlen_q, s.heads, s.head_dim_v}, 0);
    make(dq, dqv, {s.batch, s.seqlen_q, s.heads, s.head_dim}, 0);
    make(dk, dkv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, 0);
    make(dv, dvv, {s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v}, 0);
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q), 0.0f);
  }

  LseView lse_view() { return make_lse(lse.data(), s.batch, s.heads, s.seqlen_q); }

  void forward(const ForwardOptions& opts) {
    tileattn::forward(TensorView<const T>(qv), TensorView<const T>(kv), TensorView<const T>(vv), ov, lse_view(), opts);
  }
  void backward(const BackwardOptions& opts) {
    tileattn::backward(TensorView<const T>(qv), TensorView<const T>(kv), TensorView<const T>(vv),
                       TensorView<const T>(ov), lse_view(), TensorView<const T>(dov), dqv, dkv, dvv, opts);
  }
  /// The gradients as floats, contiguous [B, S, H, D] (the reference's layout).
  static std::vector<float> gather(const TensorView<T>& view) {
    std::vector<float> out;
    for_each_index(view.shape, [&](index_t b, index_t i, index_t h, index_t c) { out.push_back(to_float(view(b, i, h, c))); });
    return out;
  }
  std::vector<float> grad_q() const { return gather(dqv); }
  std::vector<float> grad_k() const { return gather(dkv); }
  std::vector<float> grad_v() const { return gather(dvv); }

  reference::BackwardResult reference(const reference::Options& opt) const {
    return reference::attention_backward<T>(qv, kv, vv, dov, opt);
  }
  reference::NaiveBackwardF naive(const reference::Options& opt) const {
    return reference::attention_backward_naive<T>(qv, kv, vv, dov, opt);
  }

 private:
  void make(std::vector<T>& buffer, TensorView<T>& view, Dims dims, std::uint64_t seed) {
    std::size_t size = 0;
    layout_view(nullptr, dims, layout, &size);
    std::vector<float> values(size);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : values) x = seed ? normal(rng) : sentinel;
    buffer.resize(size);
    for (std::size_t i = 0; i < size; ++i) buffer[i] = from_float<T>(values[i]);
    const TensorView<float> f = layout_view(values.data(), dims, layout, nullptr);  // strides and offset
    view = {buffer.data() + (f.data - values.data()), f.shape, f.stride};
  }
};

/// The magnitudes F of the terms dQ, dK and dsinks sum before they cancel, elementwise in
/// the reference's layouts (backward_fuzz.cpp's term_magnitudes: with |dP_ij|, |D_i| <=
/// ||dO_i||_1 max|V| and tanh' <= 1):
///   dQ_ic <= 2 scale max|V| max|K| ||dO_i||_1,   dK_jc <= 2 scale max|V| max|Q| sum_c' A_jc',
///   dsinks_h <= max|V| sum over head h's rows of ||dO_i||_1,
/// A the exact dV for |dO| (sum_i P_ij |dO_ic'|). Where P (dP - D) cancels to nearly nothing
/// (a one-hot row: P = 1, D = dP), M and the naive error say nothing of the rounding of
/// those terms: the naive backward is exact there by luck, a kernel that forms P as
/// 2^(s - max) and sums D in another order is not. The floor 8 u F (u = 2^-24: fp32 sums)
/// covers that rounding.
struct CancellingTerms {
  std::vector<double> dq, dk, dsinks;
};

template <class T>
CancellingTerms cancelling_terms(const BackwardProblem<T>& p, const reference::Options& ro, double scale) {
  const auto max_abs = [](const TensorView<T>& view) {
    double m = 0.0;
    for_each_index(view.shape, [&](index_t b, index_t i, index_t h, index_t c) {
      m = std::max(m, std::abs(static_cast<double>(to_float(view(b, i, h, c)))));
    });
    return m;
  };
  const double max_q = max_abs(p.qv), max_k = max_abs(p.kv), max_v = max_abs(p.vv);
  std::vector<T> abs_dout(p.dout.size());
  for (std::size_t i = 0; i < abs_dout.size(); ++i) abs_dout[i] = from_float<T>(std::abs(to_float(p.dout[i])));
  const TensorView<const T> abs_view{abs_dout.data() + (p.dov.data - p.dout.data()), p.dov.shape, p.dov.stride};
  const reference::BackwardResult a = reference::attention_backward<T>(TensorView<const T>(p.qv), TensorView<const T>(p.kv),
                                                                       TensorView<const T>(p.vv), abs_view, ro);
  const ProblemShape& s = p.s;
  CancellingTerms t;
  t.dsinks.assign(static_cast<std::size_t>(s.heads), 0.0);
  for_each_index(p.qv.shape, [&](index_t b, index_t i, index_t h, index_t c0) {
    double l1 = 0.0;
    for (index_t c = 0; c < s.head_dim_v; ++c) l1 += std::abs(static_cast<double>(to_float(p.dov(b, i, h, c))));
    t.dq.push_back(2 * scale * max_v * max_k * l1);
    if (c0 == 0) t.dsinks[static_cast<std::size_t>(h)] += max_v * l1;
  });
  for (std::size_t row = 0; row * static_cast<std::size_t>(s.head_dim_v) < a.dv.size(); ++row) {
    double sum = 0.0;
    for (index_t c = 0; c < s.head_dim_v; ++c) sum += a.dv[row * static_cast<std::size_t>(s.head_dim_v) + static_cast<std::size_t>(c)];
    for (index_t c = 0; c < s.head_dim; ++c) t.dk.push_back(2 * scale * max_v * max_q * sum);
  }
  return t;
}

/// Max |got - want| over finite reference entries, and whether the non-finite pattern
/// matches (a NaN where the reference has one, finite where it is finite).
struct GradError {
  double max_error = 0.0, magnitude = 0.0;
  std::string problem;
};

template <class Want>
GradError grad_error(const std::vector<float>& got, const std::vector<Want>& want, const std::string& name) {
  GradError e;
  if (got.size() != want.size()) {
    e.problem = name + ": sizes differ";
    return e;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double w = static_cast<double>(want[i]), g = got[i];
    if (std::isnan(w) != std::isnan(g) || (!std::isnan(w) && std::isfinite(w) != std::isfinite(g))) {
      if (e.problem.empty()) e.problem = name + "[" + std::to_string(i) + "] = " + std::to_string(g) + ", reference " + std::to_string(w);
      continue;
    }
    if (!std::isfinite(w)) continue;
    e.max_error = std::max(e.max_error, std::abs(g - w));
    e.magnitude = std::max(e.magnitude, std::abs(w));
  }
  return e;
}

}  // namespace tileattn::test
