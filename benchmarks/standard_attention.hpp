// benchmarks/standard_attention.hpp: the baseline: standard (materializing) attention on Eigen GEMMs.
//
// This is FlashAttention's "standard attention" (Algorithm 0 of the FlashAttention paper),
// implemented carefully for the CPU so that the comparison is fair:
//   - heads run in parallel, one (batch, head) per work item, through tileattn's own
//     parallel_for; Eigen itself stays single-threaded (the targets define
//     EIGEN_DONT_PARALLELIZE), so only one thread pool spins on the cores;
//   - each head's strided [seqlen, head_dim] matrices are copied into contiguous
//     row-major matrices, so Eigen's GEMM sees unit strides;
//   - S = Q K^T (Nq x Nk) is materialized in full; the causal mask writes -inf into it;
//   - the row softmax uses Eigen's vectorized exp, with the softmax scale folded into
//     the exponent: P = exp(scale * (S - rowmax)) / rowsum;
//   - O = P V.
// Workspaces (Q, K, V, O copies and the Nq x Nk matrix S/P) are kept per worker and
// reused across calls, so a timed call allocates nothing once warmed up.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::bench {

/// HBM bytes of standard attention in fp32, counted as in the FlashAttention paper's
/// Algorithm 0 (every intermediate goes through main memory):
///   read Q, K, V            Nq*d + 2*Nk*d
///   write S, read S         2*Nq*Nk      (S = Q K^T, then softmax reads it)
///   write P, read P         2*Nq*Nk      (softmax writes P, then O = P V reads it)
///   write O                 Nq*d
/// total = 4 bytes * B * H * (Nq*d + 2*Nk*d + 4*Nq*Nk + Nq*d).
/// This is the model's count, not measured DRAM traffic: it is the same for causal
/// masking (S is materialized in full), and it ignores the cache reuse inside the GEMMs.
inline std::uint64_t standard_attention_hbm_bytes(index_t batch, index_t heads, index_t seqlen_q,
                                                  index_t seqlen_k, index_t head_dim) {
  const auto b = static_cast<std::uint64_t>(batch), h = static_cast<std::uint64_t>(heads),
             nq = static_cast<std::uint64_t>(seqlen_q), nk = static_cast<std::uint64_t>(seqlen_k),
             d = static_cast<std::uint64_t>(head_dim);
  return sizeof(float) * b * h * (nq * d + 2 * nk * d + 4 * nq * nk + nq * d);
}

/// Standard attention over the same views as tileattn::forward, with per-worker workspaces.
class StandardAttention {
 public:
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  explicit StandardAttention(Execution exec = {})
      : exec_(exec), workspaces_(static_cast<std::size_t>(worker_count(exec))) {}

  /// O = softmax(scale * Q K^T [causal mask, bottom-right aligned]) V; writes lse (natural
  /// log) when lse.data is set. Rows that see no key get O = 0 and LSE = -inf, as tileattn.
  void operator()(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                  TensorView<float> o, LseView lse, float scale, bool causal) {
    const index_t batch = q.shape[dim::batch], heads = q.shape[dim::heads];
    parallel_for(exec_, batch * heads, [&](index_t item, int worker) {
      const index_t b = item / heads, h = item % heads;
      float* lse_row = lse.data ? &lse(b, h, 0) : nullptr;
      const index_t lse_stride = lse.data ? lse.stride[2] : 0;
      run_head(workspaces_[static_cast<std::size_t>(worker)], head_matrix(q, b, h),
               head_matrix(k, b, h), head_matrix(v, b, h), head_matrix(o, b, h), lse_row,
               lse_stride, scale, causal);
    });
  }

 private:
  using Strides = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using ConstHeadMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Strides>;
  using HeadMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Strides>;

  struct Workspace {
    RowMatrix q, k, v, s, o;  // (Nq, d), (Nk, d), (Nk, d), (Nq, Nk), (Nq, d)
  };

  static ConstHeadMap map(const MatrixView<const float>& m) {
    return ConstHeadMap(m.data, m.rows, m.cols, Strides(m.row_stride, m.col_stride));
  }
  static HeadMap map(const MatrixView<float>& m) {
    return HeadMap(m.data, m.rows, m.cols, Strides(m.row_stride, m.col_stride));
  }

  static void run_head(Workspace& w, const MatrixView<const float>& q,
                       const MatrixView<const float>& k, const MatrixView<const float>& v,
                       const MatrixView<float>& o, float* lse, index_t lse_stride, float scale,
                       bool causal) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const index_t nq = q.rows, nk = k.rows, offset = nk - nq;
    w.q = map(q);  // contiguous copies of the head: (Nq, d), (Nk, d), (Nk, d)
    w.k = map(k);
    w.v = map(v);
    w.s.resize(nq, nk);
    w.s.noalias() = w.q * w.k.transpose();  // S = Q K^T  (Nq, Nk)
    for (index_t i = 0; i < nq; ++i) {
      auto row = w.s.row(i).array();  // (Nk)
      if (causal) {
        const index_t visible = std::clamp<index_t>(i + offset + 1, 0, nk);
        row.tail(nk - visible).setConstant(neg_inf);  // key j > i + offset is masked
      }
      const float max = row.maxCoeff();
      if (max == neg_inf) {  // no visible key
        row.setZero();
        if (lse) lse[i * lse_stride] = neg_inf;
        continue;
      }
      row = ((row - max) * scale).exp();  // vectorized exp; -inf -> 0
      const float sum = row.sum();
      row *= 1.0f / sum;  // P  (Nk)
      if (lse) lse[i * lse_stride] = scale * max + std::log(sum);
    }
    w.o.noalias() = w.s * w.v;  // O = P V  (Nq, d)
    map(o) = w.o;
  }

  Execution exec_;
  std::vector<Workspace> workspaces_;
};

}  // namespace tileattn::bench
