// benchmarks/standard_attention_backward.hpp: the backward baseline: standard (materializing)
// attention's backward on Eigen GEMMs.
//
// This is the FlashAttention paper's standard attention backward (its Algorithm 3), with P
// recomputed from the forward's log-sum-exp as tileattn does (no N x N tensor is kept between
// the passes), implemented carefully for the CPU so that the comparison is fair:
//   - work runs in parallel, one (batch, K/V head) per work item, through tileattn's own
//     parallel_for; Eigen itself stays single-threaded (the targets define
//     EIGEN_DONT_PARALLELIZE), so only one thread pool spins on the cores;
//   - each head's strided [seqlen, head_dim] matrices (Q, K, V, O, dO) are copied into
//     contiguous row-major matrices, so Eigen's GEMMs see unit strides;
//   - P = exp(scale * Q K^T - LSE) is materialized in full (Nq x Nk); the causal mask
//     (bottom-right aligned, as tileattn's default) zeroes it, with Eigen's vectorized exp
//     on the visible part of each row only;
//   - dV = P^T dO, dP = dO V^T (Nq x Nk, materialized), D = rowsum(dO * O),
//     dS = P * (dP - D) (in dP's buffer), dQ = scale * dS K, dK = scale * dS^T Q: five
//     GEMMs of 2 * Nq * Nk * d FLOPs each, 2.5 times the forward's two, whatever the mask;
//   - GQA / MQA: a work item owns one K/V head and runs its group of query heads in turn,
//     summing their dK and dV in the workspace (no atomics, deterministic), then writes
//     them once.
// fp32 only. Workspaces (the head copies, the two Nq x Nk matrices P and dP/dS, the
// gradients) are kept per worker and reused across calls, so a timed call allocates nothing
// once warmed up. Rows whose LSE is -inf (they saw no key) get zero gradients, as tileattn.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::bench {

/// The backward of standard attention over the same views as tileattn::backward.
class StandardAttentionBackward {
 public:
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  explicit StandardAttentionBackward(Execution exec = {})
      : exec_(exec), workspaces_(static_cast<std::size_t>(worker_count(exec))) {}

  /// dq, dk, dv of O = softmax(scale * Q K^T [causal mask, bottom-right aligned]) V given
  /// dO, from the forward's O and LSE (natural log, [batch, heads_q, seqlen_q]). dk and dv
  /// are summed over each K/V head's group of query heads (heads_q a multiple of heads_kv).
  void operator()(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                  TensorView<const float> o, StridedView<const float, 3> lse, TensorView<const float> dout,
                  TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, float scale, bool causal) {
    const index_t batch = q.shape[dim::batch], heads = q.shape[dim::heads], heads_kv = k.shape[dim::heads];
    if (heads_kv <= 0 || heads % heads_kv != 0)
      throw std::invalid_argument("StandardAttentionBackward: heads_q must be a multiple of heads_kv");
    const index_t group = heads / heads_kv;
    parallel_for(exec_, batch * heads_kv, [&](index_t item, int worker) {
      const index_t b = item / heads_kv, hkv = item % heads_kv;
      Workspace& w = workspaces_[static_cast<std::size_t>(worker)];
      w.k = map(head_matrix(k, b, hkv));  // contiguous copies of the K/V head: (Nk, d), (Nk, dv)
      w.v = map(head_matrix(v, b, hkv));
      w.dk.setZero(w.k.rows(), w.k.cols());
      w.dv.setZero(w.v.rows(), w.v.cols());
      for (index_t h = hkv * group; h < (hkv + 1) * group; ++h)
        run_query_head(w, head_matrix(q, b, h), head_matrix(o, b, h), head_matrix(dout, b, h),
                       &lse(b, h, 0), lse.stride[2], head_matrix(dq, b, h), scale, causal);
      map(head_matrix(dk, b, hkv)) = w.dk;
      map(head_matrix(dv, b, hkv)) = w.dv;
    });
  }

 private:
  using Strides = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
  using ConstHeadMap = Eigen::Map<const RowMatrix, Eigen::Unaligned, Strides>;
  using HeadMap = Eigen::Map<RowMatrix, Eigen::Unaligned, Strides>;

  struct Workspace {
    RowMatrix q, k, v, o, dout;  // (Nq, d), (Nk, d), (Nk, dv), (Nq, dv), (Nq, dv)
    RowMatrix p, ds;             // (Nq, Nk): P; dP, then dS
    RowMatrix dq, dk, dv;        // (Nq, d), (Nk, d), (Nk, dv)
    Eigen::VectorXf delta;       // (Nq): D = rowsum(dO * O)
  };

  static ConstHeadMap map(const MatrixView<const float>& m) {
    return ConstHeadMap(m.data, m.rows, m.cols, Strides(m.row_stride, m.col_stride));
  }
  static HeadMap map(const MatrixView<float>& m) {
    return HeadMap(m.data, m.rows, m.cols, Strides(m.row_stride, m.col_stride));
  }

  /// One query head against the K/V head already in w.k, w.v: writes its dQ, adds its
  /// share to w.dk and w.dv.
  static void run_query_head(Workspace& w, const MatrixView<const float>& q, const MatrixView<const float>& o,
                             const MatrixView<const float>& dout, const float* lse, index_t lse_stride,
                             const MatrixView<float>& dq, float scale, bool causal) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const index_t nq = q.rows, nk = w.k.rows(), offset = nk - nq;
    w.q = map(q);
    w.o = map(o);
    w.dout = map(dout);
    w.p.resize(nq, nk);
    w.p.noalias() = w.q * w.k.transpose();  // S = Q K^T  (Nq, Nk)
    for (index_t i = 0; i < nq; ++i) {      // P = exp(scale * S - LSE), masked keys 0
      auto row = w.p.row(i).array();
      const float l = lse[i * lse_stride];
      const index_t visible = causal ? std::clamp<index_t>(i + offset + 1, 0, nk) : nk;
      if (l == neg_inf) {  // the row saw no key
        row.setZero();
        continue;
      }
      row.head(visible) = (row.head(visible) * scale - l).exp();
      row.tail(nk - visible).setZero();  // key j > i + offset is masked
    }
    w.dv.noalias() += w.p.transpose() * w.dout;                        // dV += P^T dO  (Nk, dv)
    w.ds.noalias() = w.dout * w.v.transpose();                         // dP = dO V^T  (Nq, Nk)
    w.delta.noalias() = (w.dout.array() * w.o.array()).rowwise().sum().matrix();  // D  (Nq)
    for (index_t i = 0; i < nq; ++i)                                   // dS = P * (dP - D)
      w.ds.row(i).array() = w.p.row(i).array() * (w.ds.row(i).array() - w.delta(i));
    w.dq.noalias() = scale * w.ds * w.k;                               // dQ = scale dS K  (Nq, d)
    w.dk.noalias() += scale * w.ds.transpose() * w.q;                  // dK += scale dS^T Q  (Nk, d)
    map(dq) = w.dq;
  }

  Execution exec_;
  std::vector<Workspace> workspaces_;
};

}  // namespace tileattn::bench
