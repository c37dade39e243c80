// tests/reference/naive_attention.hpp: naive attention in double precision, the reference every
// kernel is checked against. It materializes the full score matrix S and probabilities P
// (O(N^2) memory), so it is for tests and benchmarks only.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tileattn/core/strided_view.hpp"

namespace tileattn::reference {

struct AttentionResult {
  index_t batch = 0, seqlen_q = 0, heads = 0, head_dim = 0;
  std::vector<double> o;    // contiguous [batch, seqlen_q, heads, head_dim]
  std::vector<double> lse;  // contiguous [batch, heads, seqlen_q]; -inf for rows with no key

  double out(index_t b, index_t i, index_t h, index_t d) const {
    return o[((b * seqlen_q + i) * heads + h) * head_dim + d];
  }
  double log_sum_exp(index_t b, index_t h, index_t i) const {
    return lse[(b * heads + h) * seqlen_q + i];
  }
};

/// softmax(scale * Q K^T, causal mask aligned bottom-right) V, in double.
template <class T>
AttentionResult attention(const TensorView<const T>& q, const TensorView<const T>& k,
                          const TensorView<const T>& v, double scale, bool causal) {
  AttentionResult r;
  r.batch = q.shape[0];
  r.seqlen_q = q.shape[1];
  r.heads = q.shape[2];
  r.head_dim = q.shape[3];
  const index_t nk = k.shape[1], d = r.head_dim, offset = nk - r.seqlen_q;
  r.o.assign(static_cast<std::size_t>(r.batch * r.seqlen_q * r.heads * d), 0.0);
  r.lse.assign(static_cast<std::size_t>(r.batch * r.heads * r.seqlen_q), 0.0);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> s(static_cast<std::size_t>(r.seqlen_q * nk));  // S, then P
  for (index_t b = 0; b < r.batch; ++b) {
    for (index_t h = 0; h < r.heads; ++h) {
      for (index_t i = 0; i < r.seqlen_q; ++i)
        for (index_t j = 0; j < nk; ++j) {
          double dot = 0.0;
          for (index_t c = 0; c < d; ++c)
            dot += static_cast<double>(q(b, i, h, c)) * static_cast<double>(k(b, j, h, c));
          s[i * nk + j] = (causal && j > i + offset) ? neg_inf : scale * dot;
        }
      for (index_t i = 0; i < r.seqlen_q; ++i) {
        double* row = &s[i * nk];
        const double m = *std::max_element(row, row + nk);
        double& lse = r.lse[(b * r.heads + h) * r.seqlen_q + i];
        if (m == neg_inf) {
          lse = neg_inf;
          continue;
        }
        double sum = 0.0;
        for (index_t j = 0; j < nk; ++j) sum += (row[j] = std::exp(row[j] - m));
        lse = m + std::log(sum);
        for (index_t c = 0; c < d; ++c) {
          double acc = 0.0;
          for (index_t j = 0; j < nk; ++j) acc += row[j] * static_cast<double>(v(b, j, h, c));
          r.o[((b * r.seqlen_q + i) * r.heads + h) * d + c] = acc / sum;
        }
      }
    }
  }
  return r;
}

}  // namespace tileattn::reference
