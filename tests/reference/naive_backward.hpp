// tests/reference/naive_backward.hpp: the backward pass of attention for tests. It holds
//   - attention_backward: the exact analytic gradients, in double, of L = sum(dout * O) with
//     O = reference::attention(q, k, v, opt).o, for every forward option (scale, softcap,
//     causal / window in both alignments, boolean mask, additive bias, ALiBi, sinks, GQA,
//     batch_index), and attention_backward_varlen for packed variable-length batches;
//   - attention_backward_naive: "standard attention" backward in the storage precision T, as
//     PyTorch eager computes it (every intermediate materialized and rounded to T), the naive
//     same-precision implementation of FlashAttention's accuracy rule
//     (kernel error <= 3 x naive error + 2e-4, relative to the gradient's magnitude).
// Both materialize the scores and probabilities (O(N^2) work per head): tests only.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "reference/naive_attention.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::reference {

/// Gradients of one backward call, all contiguous:
///   dq [batch, seqlen_q, heads, head_dim], dk [batch, seqlen_k, heads_kv, head_dim],
///   dv [batch, seqlen_k, heads_kv, head_dim_v], dsinks [heads] (empty without sinks),
///   dbias with opt.bias's logical shape bias_shape (an extent 1 that broadcasts holds the sum
///   over that dimension; empty without bias).
template <class Real>
struct BackwardGrads {
  index_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  std::array<index_t, 4> bias_shape{};  // opt.bias.shape; all 0 without bias
  std::vector<Real> dq, dk, dv, dsinks, dbias;

  std::size_t q_index(index_t b, index_t i, index_t h, index_t c) const {
    return static_cast<std::size_t>(((b * seqlen_q + i) * heads + h) * head_dim + c);
  }
  std::size_t k_index(index_t b, index_t j, index_t hk, index_t c) const {
    return static_cast<std::size_t>(((b * seqlen_k + j) * heads_kv + hk) * head_dim + c);
  }
  std::size_t v_index(index_t b, index_t j, index_t hk, index_t c) const {
    return static_cast<std::size_t>(((b * seqlen_k + j) * heads_kv + hk) * head_dim_v + c);
  }
  /// Index into dbias of bias element (b, h, i, j), each within bias_shape (no broadcasting).
  std::size_t bias_index(index_t b, index_t h, index_t i, index_t j) const {
    return static_cast<std::size_t>(((b * bias_shape[1] + h) * bias_shape[2] + i) * bias_shape[3] + j);
  }

  Real grad_q(index_t b, index_t i, index_t h, index_t c) const { return dq[q_index(b, i, h, c)]; }
  Real grad_k(index_t b, index_t j, index_t hk, index_t c) const { return dk[k_index(b, j, hk, c)]; }
  Real grad_v(index_t b, index_t j, index_t hk, index_t c) const { return dv[v_index(b, j, hk, c)]; }
  Real grad_bias(index_t b, index_t h, index_t i, index_t j) const { return dbias[bias_index(b, h, i, j)]; }
  Real grad_sink(index_t h) const { return dsinks[static_cast<std::size_t>(h)]; }
};

/// The double-precision gradients of attention_backward (layouts: BackwardGrads).
struct BackwardResult : BackwardGrads<double> {};
/// The gradients of attention_backward_naive, as floats holding values of T.
struct NaiveBackwardF : BackwardGrads<float> {};

namespace detail {

/// Any element type as double: arithmetic types directly, bf16 / fp16 through float.
template <class T>
double to_double(const T& x) {
  if constexpr (std::is_arithmetic_v<T>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));
}

/// x rounded to storage type T and back (the identity for float).
template <class T>
float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return to_float(from_float<T>(x));
}

/// Sizes the gradient arrays of r from the views and options (all zero).
template <class Real, class T>
void shape_grads(BackwardGrads<Real>& r, const TensorView<const T>& q, const TensorView<const T>& k,
                 const TensorView<const T>& v, const Options& opt) {
  r.batch = q.shape[0];
  r.seqlen_q = q.shape[1];
  r.heads = q.shape[2];
  r.head_dim = q.shape[3];
  r.seqlen_k = k.shape[1];
  r.heads_kv = k.shape[2];
  r.head_dim_v = v.shape[3];
  r.dq.assign(static_cast<std::size_t>(r.batch * r.seqlen_q * r.heads * r.head_dim), Real(0));
  r.dk.assign(static_cast<std::size_t>(r.batch * r.seqlen_k * r.heads_kv * r.head_dim), Real(0));
  r.dv.assign(static_cast<std::size_t>(r.batch * r.seqlen_k * r.heads_kv * r.head_dim_v), Real(0));
  if (!opt.sinks.empty()) r.dsinks.assign(static_cast<std::size_t>(r.heads), Real(0));
  if (opt.bias.data) {
    r.bias_shape = opt.bias.shape;
    r.dbias.assign(static_cast<std::size_t>(r.bias_shape[0] * r.bias_shape[1] * r.bias_shape[2] * r.bias_shape[3]),
                   Real(0));
  }
}

/// dbias's element for score (bb, h, i, j): the broadcast dimensions map to index 0.
template <class Real>
std::size_t bias_slot(const BackwardGrads<Real>& r, index_t bb, index_t h, index_t i, index_t j) {
  return r.bias_index(r.bias_shape[0] == 1 ? 0 : bb, r.bias_shape[1] == 1 ? 0 : h, i, j);
}

}  // namespace detail

/// Exact gradients in double of L = sum(dout * O), O = attention(q, k, v, opt).o (dout has
/// O's shape [batch, seqlen_q, heads, head_dim_v]). With z the score after scale, softcap,
/// bias and ALiBi and P its softmax (sinks in the denominator):
///   dP_ij = Z_ij dout_i . v_j (Z: dropout's factor, 1 without), D_i = dout_i . O_i, dz_ij = P_ij (dP_ij - D_i),
///   dv_j += P_ij dout_i, dx_ij = dz_ij (1 - tanh^2(x_ij / softcap)) (dz_ij without softcap),
///   dq_i += scale dx_ij k_j, dk_j += scale dx_ij q_i, dbias += dz_ij (broadcast: summed),
///   dsinks[h] -= exp(sink_h - lse_i) D_i (summed over batch and rows).
/// GQA: a KV head's dk / dv sum over its query heads. Non-finite values follow the forward:
/// a key whose score is -inf (masked, or made -inf) takes no part (its k / v rows are never
/// read and get nothing from the row); a row that sees no key and no sink contributes zero; a
/// row that sees a NaN score gets NaN in dq_i, in the dk / dv rows of the keys it sees, in its
/// dbias entries and in dsinks.
template <class T>
BackwardResult attention_backward(const TensorView<const T>& q, const TensorView<const T>& k,
                                  const TensorView<const T>& v, const TensorView<const T>& dout,
                                  const Options& opt) {
  using detail::to_double;
  BackwardResult r;
  detail::shape_grads(r, q, k, v, opt);
  const index_t nq = r.seqlen_q, nk = r.seqlen_k, d = r.head_dim, dv = r.head_dim_v, H = r.heads;
  const index_t group = H / r.heads_kv;
  const index_t offset = opt.diagonal(nq, nk);
  const index_t right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  const double scale = opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  const double cap = opt.softcap;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto n = static_cast<std::size_t>(std::max<index_t>(nk, 1));
  std::vector<double> x(n), z(n), p(n), o(static_cast<std::size_t>(std::max<index_t>(dv, 1)));
  for (index_t b = 0; b < r.batch; ++b) {
    const index_t bb = opt.batch_index >= 0 ? opt.batch_index : b;  // index into per-batch options
    for (index_t h = 0; h < H; ++h) {
      const index_t kh = h / group;
      double slope = 0.0;
      if (!opt.alibi_slopes.empty()) {
        const bool per_batch = static_cast<index_t>(opt.alibi_slopes.size()) != H;
        slope = opt.alibi_slopes[static_cast<std::size_t>((per_batch ? bb * H : 0) + h)];
      }
      const double sink = opt.sinks.empty() ? neg_inf : static_cast<double>(opt.sinks[static_cast<std::size_t>(h)]);
      for (index_t i = 0; i < nq; ++i) {
        // Scores, exactly as the forward reference computes them.
        bool saw_nan = false;
        double m = sink;
        const detail::HeadVector qi(q, b, i, h), doi(dout, b, i, h);
        for (index_t j = 0; j < nk; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          const detail::HeadVector kj(k, b, j, kh);
          double xs = 0.0;
          for (index_t c = 0; c < d; ++c) xs += to_double(qi[c]) * to_double(kj[c]);
          xs *= scale;
          x[sj] = xs;
          double zz = cap > 0 ? cap * std::tanh(xs / cap) : xs;
          const bool outside = outside_window(opt, i, offset, j, left, right) ||
                               (opt.mask.data && !detail::broadcast_at(opt.mask, bb, h, i, j));
          if (opt.bias.data) zz += detail::broadcast_at(opt.bias, bb, h, i, j);
          zz -= slope * static_cast<double>(std::abs(i + offset - j));
          z[sj] = outside ? neg_inf : zz;
          if (!outside && std::isnan(zz)) saw_nan = true;
          if (!outside && zz > m) m = zz;
        }
        if (!saw_nan && m == neg_inf) continue;  // no key and no sink: the row adds nothing
        // Probabilities (NaN for every key that takes part when the row sees a NaN).
        double p_sink = 0.0;
        if (saw_nan) {
          for (index_t j = 0; j < nk; ++j) p[static_cast<std::size_t>(j)] = nan;
          p_sink = nan;
        } else {
          double sum = sink == neg_inf ? 0.0 : std::exp(sink - m);
          for (index_t j = 0; j < nk; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            p[sj] = z[sj] == neg_inf ? 0.0 : std::exp(z[sj] - m);
            sum += p[sj];
          }
          for (index_t j = 0; j < nk; ++j) p[static_cast<std::size_t>(j)] /= sum;
          p_sink = sink == neg_inf ? 0.0 : std::exp(sink - m) / sum;
        }
        // O_i and D_i = dout_i . O_i.
        std::fill(o.begin(), o.end(), 0.0);
        for (index_t j = 0; j < nk; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          if (z[sj] == neg_inf) continue;  // takes no part: V is not read
          const detail::HeadVector vj(v, b, j, kh);
          const double zp = p[sj] * dropout_factor(opt.dropout, bb, H, h, i, j);  // P after dropout
          for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>(c)] += zp * to_double(vj[c]);
        }
        double D = 0.0;
        for (index_t c = 0; c < dv; ++c) D += to_double(doi[c]) * o[static_cast<std::size_t>(c)];
        if (!opt.sinks.empty()) r.dsinks[static_cast<std::size_t>(h)] -= p_sink * D;
        for (index_t j = 0; j < nk; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          if (z[sj] == neg_inf) continue;
          const detail::HeadVector kj(k, b, j, kh), vj(v, b, j, kh);
          double dp = 0.0;
          for (index_t c = 0; c < dv; ++c) dp += to_double(doi[c]) * to_double(vj[c]);
          const double zf = dropout_factor(opt.dropout, bb, H, h, i, j);  // dO_i . V_j reaches P through dropout
          const double dz = p[sj] * (dp * zf - D);
          double* dvj = r.dv.data() + r.v_index(b, j, kh, 0);
          for (index_t c = 0; c < dv; ++c) dvj[c] += p[sj] * zf * to_double(doi[c]);
          double dx = dz;
          if (cap > 0) {
            const double t = std::tanh(x[sj] / cap);
            dx *= 1.0 - t * t;
          }
          double *dqi = r.dq.data() + r.q_index(b, i, h, 0), *dkj = r.dk.data() + r.k_index(b, j, kh, 0);
          for (index_t c = 0; c < d; ++c) {
            dqi[c] += scale * dx * to_double(kj[c]);
            dkj[c] += scale * dx * to_double(qi[c]);
          }
          if (opt.bias.data) r.dbias[detail::bias_slot(r, bb, h, i, j)] += dz;
        }
      }
    }
  }
  return r;
}

namespace detail {

/// A packed variable-length batch's gradients, one sequence at a time through `backward`
/// (attention_backward or attention_backward_naive), laid out as attention_backward_varlen says.
template <class Result, class T, class Backward>
Result assemble_varlen(Backward&& backward, const StridedView<const T, 3>& q, const StridedView<const T, 3>& k,
                       const StridedView<const T, 3>& v, const StridedView<const T, 3>& dout,
                       std::span<const std::int32_t> cu_seqlens_q, std::span<const std::int32_t> cu_seqlens_k,
                       const Options& opt) {
  const TensorView<const T> q4{q.data, {1, q.shape[0], q.shape[1], q.shape[2]}, {0, q.stride[0], q.stride[1], q.stride[2]}};
  const TensorView<const T> k4{k.data, {1, k.shape[0], k.shape[1], k.shape[2]}, {0, k.stride[0], k.stride[1], k.stride[2]}};
  const TensorView<const T> v4{v.data, {1, v.shape[0], v.shape[1], v.shape[2]}, {0, v.stride[0], v.stride[1], v.stride[2]}};
  Result r;
  detail::shape_grads(r, q4, k4, v4, opt);
  const auto sequences = static_cast<index_t>(cu_seqlens_q.size()) - 1;
  for (index_t s = 0; s < sequences; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const index_t q0 = cu_seqlens_q[su], nq = cu_seqlens_q[su + 1] - q0;
    const index_t k0 = cu_seqlens_k[su], nk = cu_seqlens_k[su + 1] - k0;
    Options o = opt;
    o.batch_index = s;
    const Result part = backward(sequence_view(q, q0, nq), sequence_view(k, k0, nk), sequence_view(v, k0, nk),
                                 sequence_view(dout, q0, nq), o);
    std::copy(part.dq.begin(), part.dq.end(), r.dq.begin() + static_cast<std::ptrdiff_t>(r.q_index(0, q0, 0, 0)));
    std::copy(part.dk.begin(), part.dk.end(), r.dk.begin() + static_cast<std::ptrdiff_t>(r.k_index(0, k0, 0, 0)));
    std::copy(part.dv.begin(), part.dv.end(), r.dv.begin() + static_cast<std::ptrdiff_t>(r.v_index(0, k0, 0, 0)));
    for (std::size_t e = 0; e < r.dsinks.size(); ++e) r.dsinks[e] += part.dsinks[e];
    for (std::size_t e = 0; e < r.dbias.size(); ++e) r.dbias[e] += part.dbias[e];
  }
  return r;
}

}  // namespace detail

/// attention_backward over a packed variable-length batch (FlashAttention's varlen layout):
/// sequence s owns rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and dout and likewise of
/// k and v; per-batch bias, mask and ALiBi slopes are indexed by s (opt.batch_index is
/// ignored), with positions counted from each sequence's start. The result has batch 1 and
/// seqlen_q / seqlen_k the packed totals: dq, dk, dv are the packed [total, heads, dim]
/// gradients; dbias and dsinks sum over the sequences.
template <class T>
BackwardResult attention_backward_varlen(const StridedView<const T, 3>& q, const StridedView<const T, 3>& k,
                                         const StridedView<const T, 3>& v, const StridedView<const T, 3>& dout,
                                         std::span<const std::int32_t> cu_seqlens_q,
                                         std::span<const std::int32_t> cu_seqlens_k, const Options& opt) {
  return detail::assemble_varlen<BackwardResult>(
      [](const auto&... a) { return attention_backward<T>(a...); }, q, k, v, dout, cu_seqlens_q, cu_seqlens_k, opt);
}

/// "Standard attention" backward in precision T (float, bf16 or fp16), as PyTorch eager
/// computes it: every intermediate is a materialized tensor of T, each matmul accumulates in
/// float and rounds its result to T once. Forward: S = scale Q K^T (rounded to T), softcap
/// (tanh and its product rounded to T), + bias - ALiBi (rounded to T), masked -> -inf, P =
/// softmax in float over the T scores and the sink (P and the sink's probability rounded to T),
/// O = P V. Backward: dP = dout V^T, D = rowsum(dout * O) in float, dS = P (dP - D), through
/// the softcap (dS (1 - t^2), t the stored tanh), then dS scaled, dQ = dS K, dK = dS^T Q and
/// dV = P^T dout, each rounded to T; GQA sums the group's per-head dK / dV (rounded to T) in
/// float and rounds the sum. dbias (summed over broadcast dimensions) and dsinks
/// (-sum P_sink D) are float sums of the rounded dS and P_sink. Masked scores take no part (no
/// 0 x Inf), and a row that sees no key and no sink gives zero gradients. For T = float
/// nothing is rounded beyond float arithmetic.
template <class T>
  requires storage_type<T>
NaiveBackwardF attention_backward_naive(const TensorView<const T>& q, const TensorView<const T>& k,
                                        const TensorView<const T>& v, const TensorView<const T>& dout,
                                        const Options& opt) {
  using detail::round_to;
  NaiveBackwardF r;
  detail::shape_grads(r, q, k, v, opt);
  const index_t B = r.batch, nq = r.seqlen_q, nk = r.seqlen_k, d = r.head_dim, dv = r.head_dim_v, H = r.heads;
  const index_t group = H / r.heads_kv;
  const index_t offset = opt.diagonal(nq, nk);
  const index_t right = opt.causal ? 0 : opt.window_right, left = opt.window_left;
  const auto scale = static_cast<float>(opt.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(d))));
  const float cap = opt.softcap;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto at = [nk](index_t i, index_t j) { return static_cast<std::size_t>(i * nk + j); };
  // Per (batch, head): P, the tanh of the softcap, dS; then the group sums of dK and dV.
  const auto nn = static_cast<std::size_t>(std::max<index_t>(nq * nk, 1));
  std::vector<float> P(nn), t(nn), dS(nn), o(static_cast<std::size_t>(std::max<index_t>(dv, 1)));
  std::vector<char> visible(nn);
  std::vector<float> dk_sum(r.dk.size(), 0.0f), dv_sum(r.dv.size(), 0.0f);
  index_t bb = 0;  // the sequence being computed (batch_index where set)
  const auto zf = [&](index_t h, index_t i, index_t j) {  // dropout's factor of P[i, j]
    return static_cast<float>(dropout_factor(opt.dropout, bb, H, h, i, j));
  };
  for (index_t b = 0; b < B; ++b) {
    bb = opt.batch_index >= 0 ? opt.batch_index : b;
    for (index_t h = 0; h < H; ++h) {
      const index_t kh = h / group;
      float slope = 0.0f;
      if (!opt.alibi_slopes.empty()) {
        const bool per_batch = static_cast<index_t>(opt.alibi_slopes.size()) != H;
        slope = opt.alibi_slopes[static_cast<std::size_t>((per_batch ? bb * H : 0) + h)];
      }
      const float sink = opt.sinks.empty() ? neg_inf : opt.sinks[static_cast<std::size_t>(h)];
      for (index_t i = 0; i < nq; ++i) {
        // Forward: the scores of row i, then its probabilities and O_i.
        float m = sink;
        const detail::HeadVector qi(q, b, i, h), doi(dout, b, i, h);
        for (index_t j = 0; j < nk; ++j) {
          const std::size_t e = at(i, j);
          const detail::HeadVector kj(k, b, j, kh);
          float acc = 0.0f;
          for (index_t c = 0; c < d; ++c) acc += to_float(qi[c]) * to_float(kj[c]);
          float s = round_to<T>(round_to<T>(acc) * scale);
          if (cap > 0) {
            t[e] = round_to<T>(std::tanh(s / cap));
            s = round_to<T>(cap * t[e]);
          }
          if (opt.bias.data) s += static_cast<float>(detail::broadcast_at(opt.bias, bb, h, i, j));
          s -= slope * static_cast<float>(std::abs(i + offset - j));
          s = round_to<T>(s);
          const bool outside = outside_window(opt, i, offset, j, left, right) ||
                               (opt.mask.data && !detail::broadcast_at(opt.mask, bb, h, i, j));
          visible[e] = !outside;
          P[e] = outside ? neg_inf : s;
          if (!outside && s > m) m = s;
        }
        float p_sink = 0.0f;
        if (m == neg_inf) {  // no key and no sink: P = 0 (the row adds nothing)
          for (index_t j = 0; j < nk; ++j) {
            visible[at(i, j)] = 0;
            P[at(i, j)] = 0.0f;
          }
        } else {
          float sum = sink == neg_inf ? 0.0f : std::exp(sink - m);
          for (index_t j = 0; j < nk; ++j) {
            const std::size_t e = at(i, j);
            P[e] = visible[e] ? std::exp(P[e] - m) : 0.0f;
            sum += P[e];
          }
          for (index_t j = 0; j < nk; ++j) P[at(i, j)] = round_to<T>(P[at(i, j)] / sum);
          p_sink = sink == neg_inf ? 0.0f : round_to<T>(std::exp(sink - m) / sum);
        }
        for (index_t c = 0; c < dv; ++c) {
          float acc = 0.0f;
          const T* vc = v.ptr(b, 0, kh, c);  // V's column c, key by key
          for (index_t j = 0; j < nk; ++j)
            if (visible[at(i, j)]) acc += round_to<T>(P[at(i, j)] * zf(h, i, j)) * to_float(vc[j * v.stride[1]]);
          o[static_cast<std::size_t>(c)] = round_to<T>(acc);
        }
        // Backward of row i: D_i, dP, dS (through the softcap and the scale).
        float D = 0.0f;
        for (index_t c = 0; c < dv; ++c) D += to_float(doi[c]) * o[static_cast<std::size_t>(c)];
        if (!opt.sinks.empty()) r.dsinks[static_cast<std::size_t>(h)] -= p_sink * D;
        for (index_t j = 0; j < nk; ++j) {
          const std::size_t e = at(i, j);
          if (!visible[e]) {
            dS[e] = 0.0f;
            continue;
          }
          const detail::HeadVector vj(v, b, j, kh);
          float acc = 0.0f;
          for (index_t c = 0; c < dv; ++c) acc += to_float(doi[c]) * to_float(vj[c]);
          const float dp = round_to<T>(round_to<T>(acc) * zf(h, i, j));  // dropout: Z dO . V
          float ds = round_to<T>(P[e] * (dp - D));
          if (opt.bias.data) r.dbias[detail::bias_slot(r, bb, h, i, j)] += ds;
          if (cap > 0) ds = round_to<T>(ds * (1.0f - t[e] * t[e]));
          dS[e] = round_to<T>(ds * scale);
        }
        for (index_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          const T* kc = k.ptr(b, 0, kh, c);
          for (index_t j = 0; j < nk; ++j)
            if (visible[at(i, j)]) acc += dS[at(i, j)] * to_float(kc[j * k.stride[1]]);
          r.dq[r.q_index(b, i, h, c)] = round_to<T>(acc);
        }
      }
      // dK = dS^T Q and dV = P^T dout of this query head, added to its KV head's sums.
      for (index_t j = 0; j < nk; ++j) {
        for (index_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          const T* qc = q.ptr(b, 0, h, c);
          for (index_t i = 0; i < nq; ++i)
            if (visible[at(i, j)]) acc += dS[at(i, j)] * to_float(qc[i * q.stride[1]]);
          dk_sum[r.k_index(b, j, kh, c)] += round_to<T>(acc);
        }
        for (index_t c = 0; c < dv; ++c) {
          float acc = 0.0f;
          const T* doc = dout.ptr(b, 0, h, c);
          for (index_t i = 0; i < nq; ++i)
            if (visible[at(i, j)]) acc += round_to<T>(P[at(i, j)] * zf(h, i, j)) * to_float(doc[i * dout.stride[1]]);
          dv_sum[r.v_index(b, j, kh, c)] += round_to<T>(acc);
        }
      }
    }
  }
  for (std::size_t e = 0; e < r.dk.size(); ++e) r.dk[e] = round_to<T>(dk_sum[e]);
  for (std::size_t e = 0; e < r.dv.size(); ++e) r.dv[e] = round_to<T>(dv_sum[e]);
  return r;
}

/// attention_backward_naive over a packed variable-length batch (attention_backward_varlen's
/// layout and rules).
template <class T>
  requires storage_type<T>
NaiveBackwardF attention_backward_naive_varlen(const StridedView<const T, 3>& q, const StridedView<const T, 3>& k,
                                               const StridedView<const T, 3>& v, const StridedView<const T, 3>& dout,
                                               std::span<const std::int32_t> cu_seqlens_q,
                                               std::span<const std::int32_t> cu_seqlens_k, const Options& opt) {
  return detail::assemble_varlen<NaiveBackwardF>(
      [](const auto&... a) { return attention_backward_naive<T>(a...); }, q, k, v, dout, cu_seqlens_q, cu_seqlens_k, opt);
}

}  // namespace tileattn::reference
