// benchmarks/workload.hpp: one attention problem for the benchmarks and the demo: random
// normal Q, K, V in FlashAttention's [batch, seqlen, heads, head_dim] layout, output
// buffers, and its FLOP count.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tileattn/core/strided_view.hpp"

namespace tileattn::bench {

struct AttentionShape {
  index_t batch = 1, heads = 16, seqlen_q = 2048, seqlen_k = 2048, head_dim = 128;
  bool causal = false;

  /// Useful FLOPs of one forward: 2 GEMMs of 2 * Nq * Nk * d each, per (batch, head);
  /// halved under the causal mask (the visible half of S). Both implementations are
  /// credited with the same count, whatever work they actually do.
  double flops() const {
    const double full = 4.0 * static_cast<double>(batch * heads) * static_cast<double>(seqlen_q) *
                        static_cast<double>(seqlen_k) * static_cast<double>(head_dim);
    return causal ? full / 2 : full;
  }
};

/// Owns the buffers of one problem. Inputs are N(0, 1) from a fixed seed, allocated and
/// filled once, outside any timed region.
struct AttentionWorkload {
  AttentionShape shape;
  std::vector<float> q, k, v, o, lse;

  explicit AttentionWorkload(const AttentionShape& s, std::uint32_t seed = 2026) : shape(s) {
    const auto qsize = static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads * s.head_dim);
    const auto ksize = static_cast<std::size_t>(s.batch * s.seqlen_k * s.heads * s.head_dim);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, std::size_t n) {
      x.resize(n);
      for (float& e : x) e = normal(rng);
    };
    fill(q, qsize);
    fill(k, ksize);
    fill(v, ksize);
    o.assign(qsize, 0.0f);
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q), 0.0f);
  }

  TensorView<const float> q_view() const {
    return make_bshd<const float>(q.data(), shape.batch, shape.seqlen_q, shape.heads, shape.head_dim);
  }
  TensorView<const float> k_view() const {
    return make_bshd<const float>(k.data(), shape.batch, shape.seqlen_k, shape.heads, shape.head_dim);
  }
  TensorView<const float> v_view() const {
    return make_bshd<const float>(v.data(), shape.batch, shape.seqlen_k, shape.heads, shape.head_dim);
  }
  TensorView<float> o_view() {
    return make_bshd(o.data(), shape.batch, shape.seqlen_q, shape.heads, shape.head_dim);
  }
  LseView lse_view() { return make_lse(lse.data(), shape.batch, shape.heads, shape.seqlen_q); }
};

}  // namespace tileattn::bench
