// tests/reference/naive_flex.hpp: flexible attention (FlexAttention's score_mod and mask_mod,
// include/tileattn/flex.hpp) for tests, with generic callables:
//   - flex_attention / flex_attention_backward: double precision, the reference every flex
//     kernel result is checked against. The score_mod is called on double scores (the
//     library's mods are templates over the score type; a test's own mod should be one too,
//     a generic lambda), the mask_mod on every (query, key) position: no block mask. The
//     gradients are analytic, through the score_mod's member grad() evaluated in double;
//   - flex_attention_naive / flex_attention_backward_naive: "standard attention" in the
//     storage precision T, the naive same-precision implementation of FlashAttention's rule
//     (forward: kernel error <= 2 x naive + 1e-5; backward: <= 3 x naive + 2e-4 x magnitude),
//     rounding as tests/kernels/forward_precision_test.cpp's naive_same_precision and
//     reference/naive_backward.hpp's attention_backward_naive do;
//   - the varlen forms of the double ones (packed [total, heads, dim] tensors, b = the
//     sequence, positions counted from its start).
// Semantics (docs/flex.md): x = scale q.k; z = score_mod(x, b, h, i, j); a position the
// mask_mod hides is -inf whatever z is, and so is a z of -inf; a row that sees a NaN score
// gets O = NaN and LSE = NaN; a row that sees nothing gets O = 0 and LSE = -inf (and zero
// gradients). With P = softmax(z), dP_ij = dout_i . v_j, D_i = dout_i . O_i:
//   dz_ij = P_ij (dP_ij - D_i), dx_ij = dz_ij score_mod.grad(x_ij), dv_j += P_ij dout_i,
//   dq_i += scale dx_ij k_j, dk_j += scale dx_ij q_i (GQA: K/V head h / (H / Hkv), summed).
// Everything materializes one score row per query: O(Nq Nk d) work per head, tests only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "reference/naive_attention.hpp"
#include "reference/naive_backward.hpp"
#include "tileattn/core/half_types.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::reference {

namespace detail {

/// The index the mods see for sequence b of the views (batch_index >= 0: the views hold
/// that one sequence of a larger batch).
inline index_t mod_batch(index_t batch_index, index_t b) { return batch_index >= 0 ? batch_index : b; }

/// One row's modified scores in double: x (scale q.k), z (score_mod, -inf where hidden).
/// Returns whether a visible score is NaN; m receives the largest visible z.
template <class T, class ScoreMod, class MaskMod>
bool flex_row(const TensorView<const T>& q, const TensorView<const T>& k, index_t b, index_t mb, index_t h, index_t kh,
              index_t i, double scale, const ScoreMod& score_mod, const MaskMod& mask_mod, std::vector<double>& x,
              std::vector<double>& z, double& m) {
  const index_t nk = k.shape[1], d = q.shape[3];
  const double neg_inf = -std::numeric_limits<double>::infinity();
  bool saw_nan = false;
  m = neg_inf;
  for (index_t j = 0; j < nk; ++j) {
    const auto sj = static_cast<std::size_t>(j);
    double dot = 0.0;
    for (index_t c = 0; c < d; ++c) dot += to_double(q(b, i, h, c)) * to_double(k(b, j, kh, c));
    x[sj] = scale * dot;
    const bool visible = mask_mod(mb, h, i, j);
    const double zz = visible ? static_cast<double>(score_mod(x[sj], mb, h, i, j)) : neg_inf;
    z[sj] = zz;
    if (visible && std::isnan(zz)) saw_nan = true;
    if (visible && zz > m) m = zz;
  }
  return saw_nan;
}

}  // namespace detail

/// O and LSE of flexible attention in double (AttentionResult's layouts): softmax over
/// score_mod(scale q.k) where mask_mod is true. batch_index >= 0: the views hold sequence
/// batch_index of a larger batch (what the mods see as b).
template <class T, class ScoreMod, class MaskMod>
AttentionResult flex_attention(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                               const ScoreMod& score_mod, const MaskMod& mask_mod, double scale,
                               index_t batch_index = -1) {
  AttentionResult r;
  r.batch = q.shape[0];
  r.seqlen_q = q.shape[1];
  r.heads = q.shape[2];
  r.head_dim = v.shape[3];
  const index_t nq = r.seqlen_q, nk = k.shape[1], dv = v.shape[3], group = r.heads / k.shape[2];
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.o.assign(static_cast<std::size_t>(r.batch * nq * r.heads * dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(r.batch * r.heads * nq), 0.0);
  const auto n = static_cast<std::size_t>(std::max<index_t>(nk, 1));
  std::vector<double> x(n), z(n);
  for (index_t b = 0; b < r.batch; ++b)
    for (index_t h = 0; h < r.heads; ++h)
      for (index_t i = 0; i < nq; ++i) {
        double m = neg_inf;
        const bool saw_nan = detail::flex_row(q, k, b, detail::mod_batch(batch_index, b), h, h / group, i, scale,
                                              score_mod, mask_mod, x, z, m);
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
        double sum = 0.0;
        for (index_t j = 0; j < nk; ++j) {
          const double zj = z[static_cast<std::size_t>(j)];
          if (zj == neg_inf) continue;  // adds nothing, and V is not read
          const double p = std::exp(zj - m);
          sum += p;
          for (index_t c = 0; c < dv; ++c) out[c] += p * detail::to_double(v(b, j, h / group, c));
        }
        lse = m + std::log(sum);
        for (index_t c = 0; c < dv; ++c) out[c] /= sum;
      }
  return r;
}

/// Exact gradients in double of L = sum(dout * O), O = flex_attention(...).o (BackwardResult's
/// layouts; no dsinks, no dbias). The score_mod must have grad(score, b, h, i, j).
template <class T, class ScoreMod, class MaskMod>
BackwardResult flex_attention_backward(const TensorView<const T>& q, const TensorView<const T>& k,
                                       const TensorView<const T>& v, const TensorView<const T>& dout,
                                       const ScoreMod& score_mod, const MaskMod& mask_mod, double scale,
                                       index_t batch_index = -1) {
  using detail::to_double;
  BackwardResult r;
  detail::shape_grads(r, q, k, v, Options{});
  const index_t nq = r.seqlen_q, nk = r.seqlen_k, d = r.head_dim, dv = r.head_dim_v, group = r.heads / r.heads_kv;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto n = static_cast<std::size_t>(std::max<index_t>(nk, 1));
  std::vector<double> x(n), z(n), p(n), o(static_cast<std::size_t>(std::max<index_t>(dv, 1)));
  for (index_t b = 0; b < r.batch; ++b) {
    const index_t mb = detail::mod_batch(batch_index, b);
    for (index_t h = 0; h < r.heads; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < nq; ++i) {
        double m = neg_inf;
        const bool saw_nan = detail::flex_row(q, k, b, mb, h, kh, i, scale, score_mod, mask_mod, x, z, m);
        if (!saw_nan && m == neg_inf) continue;  // sees nothing: adds nothing
        if (saw_nan) {
          std::fill(p.begin(), p.end(), nan);
        } else {
          double sum = 0.0;
          for (index_t j = 0; j < nk; ++j) {
            const auto sj = static_cast<std::size_t>(j);
            p[sj] = z[sj] == neg_inf ? 0.0 : std::exp(z[sj] - m);
            sum += p[sj];
          }
          for (index_t j = 0; j < nk; ++j) p[static_cast<std::size_t>(j)] /= sum;
        }
        std::fill(o.begin(), o.end(), 0.0);
        for (index_t j = 0; j < nk; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          if (z[sj] == neg_inf) continue;
          for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>(c)] += p[sj] * to_double(v(b, j, kh, c));
        }
        double D = 0.0;
        for (index_t c = 0; c < dv; ++c) D += to_double(dout(b, i, h, c)) * o[static_cast<std::size_t>(c)];
        for (index_t j = 0; j < nk; ++j) {
          const auto sj = static_cast<std::size_t>(j);
          if (z[sj] == neg_inf) continue;  // takes no part: its k and v rows are not read
          double dp = 0.0;
          for (index_t c = 0; c < dv; ++c) dp += to_double(dout(b, i, h, c)) * to_double(v(b, j, kh, c));
          for (index_t c = 0; c < dv; ++c) r.dv[r.v_index(b, j, kh, c)] += p[sj] * to_double(dout(b, i, h, c));
          const double dx = p[sj] * (dp - D) * static_cast<double>(score_mod.grad(x[sj], mb, h, i, j));
          for (index_t c = 0; c < d; ++c) {
            r.dq[r.q_index(b, i, h, c)] += scale * dx * to_double(k(b, j, kh, c));
            r.dk[r.k_index(b, j, kh, c)] += scale * dx * to_double(q(b, i, h, c));
          }
        }
      }
    }
  }
  return r;
}

/// flex_attention over a packed variable-length batch: sequence s owns rows
/// [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q and likewise of k and v; the mods see b = s and
/// positions within the sequence. The result has batch 1 and seqlen_q the packed total
/// (o [1, total_q, heads, dv], lse [1, heads, total_q]).
template <class T, class ScoreMod, class MaskMod>
AttentionResult flex_attention_varlen(const StridedView<const T, 3>& q, const StridedView<const T, 3>& k,
                                      const StridedView<const T, 3>& v, std::span<const std::int32_t> cu_seqlens_q,
                                      std::span<const std::int32_t> cu_seqlens_k, const ScoreMod& score_mod,
                                      const MaskMod& mask_mod, double scale) {
  AttentionResult r;
  r.batch = 1;
  r.seqlen_q = q.shape[0];
  r.heads = q.shape[1];
  r.head_dim = v.shape[2];
  r.o.assign(static_cast<std::size_t>(r.seqlen_q * r.heads * r.head_dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(r.heads * r.seqlen_q), 0.0);
  for (std::size_t s = 0; s + 1 < cu_seqlens_q.size(); ++s) {
    const index_t q0 = cu_seqlens_q[s], nq = cu_seqlens_q[s + 1] - q0;
    const index_t k0 = cu_seqlens_k[s], nk = cu_seqlens_k[s + 1] - k0;
    const AttentionResult part =
        flex_attention<T>(sequence_view(q, q0, nq), sequence_view(k, k0, nk), sequence_view(v, k0, nk), score_mod,
                          mask_mod, scale, static_cast<index_t>(s));
    for (index_t i = 0; i < nq; ++i)
      for (index_t h = 0; h < r.heads; ++h) {
        r.lse[static_cast<std::size_t>(h * r.seqlen_q + q0 + i)] = part.log_sum_exp(0, h, i);
        for (index_t c = 0; c < r.head_dim; ++c)
          r.o[static_cast<std::size_t>(((q0 + i) * r.heads + h) * r.head_dim + c)] = part.out(0, i, h, c);
      }
  }
  return r;
}

/// flex_attention_backward over a packed variable-length batch (flex_attention_varlen's
/// rules; attention_backward_varlen's result layout: batch 1, packed rows).
template <class T, class ScoreMod, class MaskMod>
BackwardResult flex_attention_backward_varlen(const StridedView<const T, 3>& q, const StridedView<const T, 3>& k,
                                              const StridedView<const T, 3>& v, const StridedView<const T, 3>& dout,
                                              std::span<const std::int32_t> cu_seqlens_q,
                                              std::span<const std::int32_t> cu_seqlens_k, const ScoreMod& score_mod,
                                              const MaskMod& mask_mod, double scale) {
  return detail::assemble_varlen<BackwardResult>(
      [&](const auto& qs, const auto& ks, const auto& vs, const auto& ds, const Options& o) {
        return flex_attention_backward<T>(qs, ks, vs, ds, score_mod, mask_mod, scale, o.batch_index);
      },
      q, k, v, dout, cu_seqlens_q, cu_seqlens_k, Options{});
}

/// Standard flexible attention the way a plain T implementation computes it: S = fp32
/// dot(q_i, k_j) * scale rounded to T, score_mod in fp32 on it, mask_mod, max-subtracted
/// softmax in fp32, P = exp(s - max) rounded to T for P V, O = sum P_T V in fp32 divided by
/// the fp32 sum and rounded to T, LSE = max + log(sum) in fp32 (T = float: naive fp32).
/// Writes O (as floats holding values of T) and the LSE.
template <storage_type T, class ScoreMod, class MaskMod>
void flex_attention_naive(const TensorView<const T>& q, const TensorView<const T>& k, const TensorView<const T>& v,
                          const ScoreMod& score_mod, const MaskMod& mask_mod, float scale, const TensorView<float>& o,
                          const LseView& lse) {
  using detail::round_to;
  const index_t B = q.shape[0], nq = q.shape[1], H = q.shape[2], d = q.shape[3];
  const index_t nk = k.shape[1], dv = v.shape[3], group = H / k.shape[2];
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(static_cast<std::size_t>(std::max<index_t>(nk, 1))), acc(static_cast<std::size_t>(dv));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < nq; ++i) {
        float m = neg_inf;
        for (index_t j = 0; j < nk; ++j) {
          float dot = 0.0f;
          for (index_t c = 0; c < d; ++c) dot += to_float(q(b, i, h, c)) * to_float(k(b, j, kh, c));
          const float x = round_to<T>(dot * scale);  // S stored in T, as a T matmul returns it
          const float z = mask_mod(b, h, i, j) ? static_cast<float>(score_mod(x, b, h, i, j)) : neg_inf;
          s[static_cast<std::size_t>(j)] = z;
          m = std::max(m, z);
        }
        if (m == neg_inf) {
          for (index_t c = 0; c < dv; ++c) o(b, i, h, c) = 0.0f;
          lse(b, h, i) = neg_inf;
          continue;
        }
        float sum = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (index_t j = 0; j < nk; ++j) {
          const float sj = s[static_cast<std::size_t>(j)];
          if (sj == neg_inf) continue;
          const float p = std::exp(sj - m);
          sum += p;
          const float p_t = round_to<T>(p);  // P stored in T for the P V product
          for (index_t c = 0; c < dv; ++c) acc[static_cast<std::size_t>(c)] += p_t * to_float(v(b, j, kh, c));
        }
        for (index_t c = 0; c < dv; ++c) o(b, i, h, c) = round_to<T>(acc[static_cast<std::size_t>(c)] / sum);
        lse(b, h, i) = m + std::log(sum);
      }
    }
}

/// Standard flexible attention backward in precision T, as PyTorch eager computes it (every
/// intermediate a materialized tensor of T, each matmul accumulating in float and rounding its
/// result to T once): attention_backward_naive's steps with the score_mod in place of the
/// softcap: S = scale Q K^T (rounded), Z = score_mod(S) (rounded), masked -> -inf, P =
/// softmax in float (rounded), O = P V (rounded); dP = dout V^T (rounded), D = rowsum(dout *
/// O) in float, dZ = P (dP - D) (rounded), dS = dZ grad(S) (rounded), times scale (rounded);
/// dQ = dS K, dK = dS^T Q, dV = P^T dout, each rounded; GQA sums of dK, dV rounded once.
template <storage_type T, class ScoreMod, class MaskMod>
NaiveBackwardF flex_attention_backward_naive(const TensorView<const T>& q, const TensorView<const T>& k,
                                             const TensorView<const T>& v, const TensorView<const T>& dout,
                                             const ScoreMod& score_mod, const MaskMod& mask_mod, float scale) {
  using detail::round_to;
  NaiveBackwardF r;
  detail::shape_grads(r, q, k, v, Options{});
  const index_t B = r.batch, nq = r.seqlen_q, nk = r.seqlen_k, d = r.head_dim, dv = r.head_dim_v, H = r.heads;
  const index_t group = H / r.heads_kv;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto at = [nk](index_t i, index_t j) { return static_cast<std::size_t>(i * nk + j); };
  const auto nn = static_cast<std::size_t>(std::max<index_t>(nq * nk, 1));
  std::vector<float> P(nn), S(nn), dS(nn), o(static_cast<std::size_t>(std::max<index_t>(dv, 1)));
  std::vector<char> visible(nn);
  std::vector<float> dk_sum(r.dk.size(), 0.0f), dv_sum(r.dv.size(), 0.0f);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < nq; ++i) {
        float m = neg_inf;
        for (index_t j = 0; j < nk; ++j) {
          const std::size_t e = at(i, j);
          float acc = 0.0f;
          for (index_t c = 0; c < d; ++c) acc += to_float(q(b, i, h, c)) * to_float(k(b, j, kh, c));
          S[e] = round_to<T>(round_to<T>(acc) * scale);
          const float z = round_to<T>(static_cast<float>(score_mod(S[e], b, h, i, j)));
          visible[e] = mask_mod(b, h, i, j) && z != neg_inf;
          P[e] = visible[e] ? z : neg_inf;
          if (visible[e] && z > m) m = z;
        }
        if (m == neg_inf) {
          for (index_t j = 0; j < nk; ++j) {
            visible[at(i, j)] = 0;
            P[at(i, j)] = 0.0f;
          }
        } else {
          float sum = 0.0f;
          for (index_t j = 0; j < nk; ++j) {
            const std::size_t e = at(i, j);
            P[e] = visible[e] ? std::exp(P[e] - m) : 0.0f;
            sum += P[e];
          }
          for (index_t j = 0; j < nk; ++j) P[at(i, j)] = round_to<T>(P[at(i, j)] / sum);
        }
        for (index_t c = 0; c < dv; ++c) {
          float acc = 0.0f;
          for (index_t j = 0; j < nk; ++j)
            if (visible[at(i, j)]) acc += P[at(i, j)] * to_float(v(b, j, kh, c));
          o[static_cast<std::size_t>(c)] = round_to<T>(acc);
        }
        float D = 0.0f;
        for (index_t c = 0; c < dv; ++c) D += to_float(dout(b, i, h, c)) * o[static_cast<std::size_t>(c)];
        for (index_t j = 0; j < nk; ++j) {
          const std::size_t e = at(i, j);
          if (!visible[e]) {
            dS[e] = 0.0f;
            continue;
          }
          float acc = 0.0f;
          for (index_t c = 0; c < dv; ++c) acc += to_float(dout(b, i, h, c)) * to_float(v(b, j, kh, c));
          const float dz = round_to<T>(P[e] * (round_to<T>(acc) - D));
          const float ds = round_to<T>(dz * static_cast<float>(score_mod.grad(S[e], b, h, i, j)));
          dS[e] = round_to<T>(ds * scale);
        }
        for (index_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          for (index_t j = 0; j < nk; ++j)
            if (visible[at(i, j)]) acc += dS[at(i, j)] * to_float(k(b, j, kh, c));
          r.dq[r.q_index(b, i, h, c)] = round_to<T>(acc);
        }
      }
      for (index_t j = 0; j < nk; ++j) {
        for (index_t c = 0; c < d; ++c) {
          float acc = 0.0f;
          for (index_t i = 0; i < nq; ++i)
            if (visible[at(i, j)]) acc += dS[at(i, j)] * to_float(q(b, i, h, c));
          dk_sum[r.k_index(b, j, kh, c)] += round_to<T>(acc);
        }
        for (index_t c = 0; c < dv; ++c) {
          float acc = 0.0f;
          for (index_t i = 0; i < nq; ++i)
            if (visible[at(i, j)]) acc += P[at(i, j)] * to_float(dout(b, i, h, c));
          dv_sum[r.v_index(b, j, kh, c)] += round_to<T>(acc);
        }
      }
    }
  for (std::size_t e = 0; e < r.dk.size(); ++e) r.dk[e] = round_to<T>(dk_sum[e]);
  for (std::size_t e = 0; e < r.dv.size(); ++e) r.dv[e] = round_to<T>(dv_sum[e]);
  return r;
}

}  // namespace tileattn::reference
