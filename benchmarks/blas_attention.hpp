// benchmarks/blas_attention.hpp: standard (materializing) attention on OpenBLAS, written the
// careful way: heads in parallel on the library's own threads, OpenBLAS single-threaded
// inside each head (no thread-pool fight), scale folded into the sgemm, and a vectorized
// exponential. It is the baseline a good engineer would write, not a strawman.
// Its HBM traffic is standard_attention_hbm_bytes() (standard_attention.hpp).
#pragma once

#include <cblas.h>

#include <algorithm>
#include <limits>
#include <numbers>
#include <vector>

#include "tileattn/arch/native.hpp"
#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn::bench {

/// O = softmax(scale Q K^T [causal, bottom-right]) V with one (batch, head) per work item.
class BlasAttention {
 public:
  BlasAttention(index_t nq, index_t nk, index_t d, int workers)
      : nq_(nq), nk_(nk), d_(d), scratch_(static_cast<std::size_t>(workers)) {
    for (auto& s : scratch_) {
      s.q.resize(static_cast<std::size_t>(nq * d));
      s.k.resize(static_cast<std::size_t>(nk * d));
      s.v.resize(static_cast<std::size_t>(nk * d));
      s.o.resize(static_cast<std::size_t>(nq * d));
      s.s.resize(static_cast<std::size_t>(nq * nk));
    }
    openblas_set_num_threads(1);
  }

  void run(const TensorView<const float>& q, const TensorView<const float>& k,
           const TensorView<const float>& v, const TensorView<float>& o, float scale,
           bool causal, const Execution& exec) {
    const index_t batch = q.shape[0], heads = q.shape[2];
    parallel_for(exec, batch * heads, [&](index_t item, int worker) {
      head(q, k, v, o, item / heads, item % heads, scale, causal, scratch_[static_cast<std::size_t>(worker)]);
    });
  }

 private:
  struct Scratch {
    std::vector<float> q, k, v, o, s;
  };

  static void gather(const TensorView<const float>& t, index_t b, index_t h, std::vector<float>& out) {
    const auto m = head_matrix(t, b, h);
    for (index_t r = 0; r < m.rows; ++r) std::copy_n(m.row(r), m.cols, out.data() + r * m.cols);
  }

  void head(const TensorView<const float>& q, const TensorView<const float>& k,
            const TensorView<const float>& v, const TensorView<float>& o, index_t b, index_t h,
            float scale, bool causal, Scratch& w) const {
    const int nq = static_cast<int>(nq_), nk = static_cast<int>(nk_), d = static_cast<int>(d_);
    gather(q, b, h, w.q);
    gather(k, b, h, w.k);
    gather(v, b, h, w.v);
    constexpr float log2e = std::numbers::log2e_v<float>;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, d, scale * log2e, w.q.data(), d,
                w.k.data(), d, 0.0f, w.s.data(), nk);  // S (Nq, Nk) in log2 units
    for (index_t i = 0; i < nq_; ++i) {
      float* row = w.s.data() + i * nk_;
      const index_t visible = causal ? std::clamp<index_t>(i + nk_ - nq_ + 1, 0, nk_) : nk_;
      std::fill(row + visible, row + nk_, 0.0f);
      if (visible == 0) continue;
      const float sum = arch::native::exp2_shift_sum(row, visible, 1.0f, arch::native::row_max(row, visible));
      arch::native::scale(row, visible, 1.0f / sum);  // P
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, d, nk, 1.0f, w.s.data(), nk,
                w.v.data(), d, 0.0f, w.o.data(), d);  // O (Nq, d)
    const auto out = head_matrix(o, b, h);
    for (index_t r = 0; r < nq_; ++r) std::copy_n(w.o.data() + r * d_, d_, out.row(r));
  }

  index_t nq_, nk_, d_;
  std::vector<Scratch> scratch_;
};

}  // namespace tileattn::bench
