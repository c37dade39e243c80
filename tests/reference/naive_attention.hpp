// tests/reference/naive_attention.hpp: naive attention in double precision, the reference every
// kernel is checked against. It materializes the full score matrix S and probabilities P
// (O(N^2) memory), so it is for tests and benchmarks only. It implements every forward
// option literally, in FlashAttention's order: scale, softcap, masks (causal / window /
// boolean), additive bias and ALiBi, softmax with sinks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "tileattn/core/params.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::reference {

struct AttentionResult {
  index_t batch = 0, seqlen_q = 0, heads = 0, head_dim = 0;
  std::vector<double> o;    // contiguous [batch, seqlen_q, heads, head_dim]
  std::vector<double> lse;  // contiguous [batch, heads, seqlen_q]; -inf for rows with no key

  double out(index_t b, index_t i, index_t h, index_t d) const {
    return o[static_cast<std::size_t>(((b * seqlen_q + i) * heads + h) * head_dim + d)];
  }
  double log_sum_exp(index_t b, index_t h, index_t i) const {
    return lse[static_cast<std::size_t>((b * heads + h) * seqlen_q + i)];
  }
};

/// The options of ForwardOptions that change the math (softmax_scale unset: 1/sqrt(d)).
/// Per-batch bias, mask and ALiBi slopes are indexed with `batch_index` for batch b = 0.
struct Options : ScoreOptions {
  std::optional<double> softmax_scale;
  index_t batch_index = -1;  // >= 0: the views hold one sequence, this one of a larger batch

  static Options from(const ForwardOptions& f) {
    Options o;
    static_cast<ScoreOptions&>(o) = f;
    if (f.softmax_scale) o.softmax_scale = *f.softmax_scale;
    return o;
  }
};

namespace detail {
template <class V>
double broadcast_at(const V& v, index_t b, index_t h, index_t i, index_t j) {
  return static_cast<double>(v(v.shape[0] == 1 ? 0 : b, v.shape[1] == 1 ? 0 : h, i, j));
}
}  // namespace detail

/// Reference attention with every option; K/V head of query head h is h / (Hq / Hkv).
template <class T>
AttentionResult attention(const TensorView<const T>& q, const TensorView<const T>& k,
                          const TensorView<const T>& v, const Options& opt) {
  AttentionResult r;
  r.batch = q.shape[0];
  r.seqlen_q = q.shape[1];
  r.heads = q.shape[2];
  r.head_dim = q.shape[3];
  const index_t nq = r.seqlen_q, nk = k.shape[1], d = r.head_dim, group = r.heads / k.shape[2];
  const index_t offset = opt.alignment == MaskAlignment::bottom_right ? nk - nq : 0;
  const index_t right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  r.o.assign(static_cast<std::size_t>(r.batch * nq * r.heads * d), 0.0);
  r.lse.assign(static_cast<std::size_t>(r.batch * r.heads * nq), 0.0);
  std::vector<double> s(static_cast<std::size_t>(std::max<index_t>(nk, 1)));  // one row of S, then P
  for (index_t b = 0; b < r.batch; ++b) {
    const index_t bb = opt.batch_index >= 0 ? opt.batch_index : b;  // index into per-batch options
    for (index_t h = 0; h < r.heads; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < nq; ++i) {
        for (index_t j = 0; j < nk; ++j) {
          double x = 0.0;
          for (index_t c = 0; c < d; ++c)
            x += static_cast<double>(q(b, i, h, c)) * static_cast<double>(k(b, j, kh, c));
          x *= scale;
          if (opt.softcap > 0) x = opt.softcap * std::tanh(x / opt.softcap);
          const bool outside = (right >= 0 && j > i + offset + right) ||
                               (left >= 0 && j < i + offset - left) ||
                               (opt.mask.data && !detail::broadcast_at(opt.mask, bb, h, i, j));
          if (opt.bias.data) x += detail::broadcast_at(opt.bias, bb, h, i, j);
          if (!opt.alibi_slopes.empty()) {
            const bool per_batch = static_cast<index_t>(opt.alibi_slopes.size()) != r.heads;
            const double slope = opt.alibi_slopes[static_cast<std::size_t>((per_batch ? bb * r.heads : 0) + h)];
            x -= slope * static_cast<double>(std::abs(i + offset - j));
          }
          s[static_cast<std::size_t>(j)] = outside ? neg_inf : x;
        }
        const double sink = opt.sinks.empty() ? neg_inf : static_cast<double>(opt.sinks[static_cast<std::size_t>(h)]);
        const double m = std::max(sink, nk ? *std::max_element(s.begin(), s.begin() + nk) : neg_inf);
        double& lse = r.lse[static_cast<std::size_t>((b * r.heads + h) * nq + i)];
        if (m == neg_inf) {
          lse = neg_inf;
          continue;
        }
        double sum = sink == neg_inf ? 0.0 : std::exp(sink - m);
        for (index_t j = 0; j < nk; ++j) sum += (s[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - m));
        lse = m + std::log(sum);
        for (index_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (index_t j = 0; j < nk; ++j) acc += s[static_cast<std::size_t>(j)] * static_cast<double>(v(b, j, kh, c));
          r.o[static_cast<std::size_t>(((b * nq + i) * r.heads + h) * d + c)] = acc / sum;
        }
      }
    }
  }
  return r;
}

/// softmax(scale * Q K^T, causal mask aligned bottom-right) V, in double.
template <class T>
AttentionResult attention(const TensorView<const T>& q, const TensorView<const T>& k,
                          const TensorView<const T>& v, double scale, bool causal) {
  Options opt;
  opt.softmax_scale = scale;
  opt.causal = causal;
  return attention(q, k, v, opt);
}

/// One sequence of a packed varlen batch as a [1, len, heads, head_dim] view.
template <class T>
TensorView<const T> sequence_view(const StridedView<const T, 3>& packed, index_t start, index_t len) {
  return {packed.data + start * packed.stride[0],
          {1, len, packed.shape[1], packed.shape[2]},
          {0, packed.stride[0], packed.stride[1], packed.stride[2]}};
}

}  // namespace tileattn::reference
