// tests/reference/naive_attention.hpp: naive attention in double precision, the reference every
// kernel is checked against. It materializes the full score matrix S and probabilities P
// (O(N^2) memory), so it is for tests and benchmarks only. It implements every forward
// option literally, in FlashAttention's order: scale, softcap, masks (causal / window /
// boolean), additive bias and ALiBi, softmax with sinks, dropout (its decisions from
// reference/dropout_reference.hpp, the sequence index being batch_index where set).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "tileattn/core/params.hpp"
#include "tileattn/core/strided_view.hpp"
#include "reference/dropout_reference.hpp"

namespace tileattn::reference {

struct AttentionResult {
  index_t batch = 0, seqlen_q = 0, heads = 0, head_dim = 0;  // head_dim: of V and O
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
/// Head vector (b, i, h) of a [batch, seqlen, heads, head_dim] view, indexed by pointer and
/// stride: the references' inner loops read their operands this way rather than through
/// StridedView's per-element offset sum, which cost most of a sanitizer build's reference
/// time at -O1 (the same elements, the same arithmetic).
template <class T>
struct HeadVector {
  T* p;
  index_t stride;
  HeadVector(const StridedView<T, 4>& t, index_t b, index_t i, index_t h)
      : p(t.ptr(b, i, h, 0)), stride(t.stride[3]) {}
  T& operator[](index_t c) const { return p[c * stride]; }
};

template <class V>
double broadcast_at(const V& v, index_t b, index_t h, index_t i, index_t j) {
  return static_cast<double>(v(v.shape[0] == 1 ? 0 : b, v.shape[1] == 1 ? 0 : h, i, j));
}
}  // namespace detail

/// Whether key j lies within `side` of position i + offset on the given side: a plain
/// comparison in 128-bit arithmetic, so windows up to INT64_MAX never overflow.
inline bool within(index_t i, index_t offset, index_t j, index_t side, bool left) {
  if (side < 0) return true;
  const __int128 diagonal = static_cast<__int128>(i) + offset;
  return left ? static_cast<__int128>(j) >= diagonal - side : static_cast<__int128>(j) <= diagonal + side;
}

/// Whether key j lies in the attention chunk of position i + offset (chunk <= 0: no chunks):
/// the definition, floor((i + offset) / chunk) == floor(j / chunk), in 128-bit arithmetic.
inline bool in_chunk(index_t i, index_t offset, index_t j, index_t chunk) {
  if (chunk <= 0) return true;
  const auto floor_div = [](__int128 a, __int128 c) { return a >= 0 ? a / c : -((-a + c - 1) / c); };
  return floor_div(static_cast<__int128>(i) + offset, chunk) == floor_div(j, chunk);
}

/// Whether query i does not see key j through the causal / sliding window (left, right
/// resolved: causal is right = 0) or the attention chunk.
inline bool outside_window(const ScoreOptions& opt, index_t i, index_t offset, index_t j, index_t left, index_t right) {
  return !within(i, offset, j, right, false) || !within(i, offset, j, left, true) ||
         !in_chunk(i, offset, j, opt.attention_chunk);
}

/// Reference attention with every option; K/V head of query head h is h / (Hq / Hkv). V
/// and O may have a head_dim of their own. NaN semantics (docs/options.md): a row that sees
/// a NaN score gets O = NaN and LSE = NaN; a key whose score is -inf (masked, or made -inf)
/// adds nothing, and its V row is never read, so an Inf or NaN there reaches no output.
template <class T>
AttentionResult attention(const TensorView<const T>& q, const TensorView<const T>& k,
                          const TensorView<const T>& v, const Options& opt) {
  AttentionResult r;
  r.batch = q.shape[0];
  r.seqlen_q = q.shape[1];
  r.heads = q.shape[2];
  r.head_dim = v.shape[3];
  const index_t nq = r.seqlen_q, nk = k.shape[1], d = q.shape[3], dv = v.shape[3];
  const index_t group = r.heads / k.shape[2];
  const index_t offset = opt.diagonal(nq, nk);
  const index_t right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.o.assign(static_cast<std::size_t>(r.batch * nq * r.heads * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(r.batch * r.heads * nq), 0.0);
  std::vector<double> s(static_cast<std::size_t>(std::max<index_t>(nk, 1)));  // one row of S, then P
  for (index_t b = 0; b < r.batch; ++b) {
    const index_t bb = opt.batch_index >= 0 ? opt.batch_index : b;  // index into per-batch options
    for (index_t h = 0; h < r.heads; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < nq; ++i) {
        bool saw_nan = false;
        double m = opt.sinks.empty() ? neg_inf : static_cast<double>(opt.sinks[static_cast<std::size_t>(h)]);
        const double sink = m;
        const detail::HeadVector qi(q, b, i, h);
        for (index_t j = 0; j < nk; ++j) {
          const detail::HeadVector kj(k, b, j, kh);
          double x = 0.0;
          for (index_t c = 0; c < d; ++c) x += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
          x *= scale;
          if (opt.softcap > 0) x = opt.softcap * std::tanh(x / opt.softcap);
          const bool outside = outside_window(opt, i, offset, j, left, right) ||
                               (opt.mask.data && !detail::broadcast_at(opt.mask, bb, h, i, j));
          if (opt.bias.data) x += detail::broadcast_at(opt.bias, bb, h, i, j);
          if (!opt.alibi_slopes.empty()) {
            const bool per_batch = static_cast<index_t>(opt.alibi_slopes.size()) != r.heads;
            const double slope = opt.alibi_slopes[static_cast<std::size_t>((per_batch ? bb * r.heads : 0) + h)];
            x -= slope * static_cast<double>(std::abs(i + offset - j));
          }
          s[static_cast<std::size_t>(j)] = outside ? neg_inf : x;
          if (!outside && std::isnan(x)) saw_nan = true;
          if (!outside && x > m) m = x;
        }
        double& lse = r.lse[static_cast<std::size_t>((b * r.heads + h) * nq + i)];
        double* out = &r.o[static_cast<std::size_t>(((b * nq + i) * r.heads + h) * dv)];
        if (saw_nan) {
          lse = nan;
          std::fill(out, out + dv, nan);
          continue;
        }
        if (m == neg_inf) {
          lse = neg_inf;
          continue;
        }
        double sum = sink == neg_inf ? 0.0 : std::exp(sink - m);
        for (index_t j = 0; j < nk; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - m);
        lse = m + std::log(sum);
        for (index_t j = 0; j < nk; ++j) {
          const double sj = s[static_cast<std::size_t>(j)];
          if (sj == neg_inf) continue;  // adds nothing, and V is not read
          const double p = std::exp(sj - m) * dropout_factor(opt.dropout, bb, r.heads, h, i, j);  // dropout: after the sum
          const detail::HeadVector vj(v, b, j, kh);
          for (index_t c = 0; c < dv; ++c) out[c] += p * static_cast<double>(vj[c]);
        }
        for (index_t c = 0; c < dv; ++c) out[c] /= sum;
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

/// One sequence of a packed varlen batch as a [1, len, heads, head_dim] view (an empty one
/// keeps the buffer's start: it may begin past the last row).
template <class T>
TensorView<const T> sequence_view(const StridedView<const T, 3>& packed, index_t start, index_t len) {
  return {len > 0 ? packed.data + start * packed.stride[0] : packed.data,
          {1, len, packed.shape[1], packed.shape[2]},
          {0, packed.stride[0], packed.stride[1], packed.stride[2]}};
}

}  // namespace tileattn::reference
