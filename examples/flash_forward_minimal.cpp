// examples/flash_forward_minimal.cpp: a self-contained FlashAttention-2 forward for one head,
// in plain C++20 (standard library only), written to be read next to Algorithm 1 of the paper.
//
//   g++ -std=c++20 -O2 flash_forward_minimal.cpp -o flash_minimal && ./flash_minimal
//
// Q is [Nq, d], K and V are [Nk, d], O is [Nq, d], all row-major float; LSE is [Nq].
// The outer loop walks query tiles Q_i of Br rows, the inner loop key/value tiles K_j, V_j
// of Bc rows. Each query tile keeps a running row max m and row sum l (the online softmax),
// so the Nq x Nk score matrix is never stored: only one (Br, Bc) tile of it at a time.
// tileattn's kernels/forward.hpp is this loop with SIMD tiles, threads and strided views.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace flash_minimal {

using index_t = std::ptrdiff_t;

inline constexpr index_t Br = 32;  // query tile rows (B_r in the paper)
inline constexpr index_t Bc = 32;  // key/value tile rows (B_c in the paper)
inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// O = softmax(scale * Q K^T) V and LSE = log(rowsum(exp(scale * Q K^T))) for one head.
/// With `causal`, query i sees key j iff j <= i + Nk - Nq (aligned bottom-right, as in
/// FlashAttention); a query that sees no key gets O = 0 and LSE = -inf.
inline void flash_forward(const float* Q, const float* K, const float* V, float* O, float* LSE,
                          index_t Nq, index_t Nk, index_t d, float scale, bool causal) {
  const index_t offset = Nk - Nq;  // causal: query i sees key j iff j <= i + offset
  // The on-chip working set of one query tile (SRAM on a GPU, L1/L2 cache here).
  std::vector<float> sram(static_cast<std::size_t>(Br * Bc + Br * d + 2 * Br));
  float* S = sram.data();               // (Br, Bc) scores, then probabilities P
  float* Oi = S + Br * Bc;              // (Br, d)  output accumulator of the query tile
  float* m = Oi + Br * d;               // (Br)     running row max
  float* l = m + Br;                    // (Br)     running row sum

  for (index_t i0 = 0; i0 < Nq; i0 += Br) {                     // query tile Q_i
    const index_t rows = std::min(Br, Nq - i0);
    const float* Qi = Q + i0 * d;                                // (rows, d)
    std::fill(Oi, Oi + rows * d, 0.0f);                          // (rows, d)
    std::fill(m, m + rows, neg_inf);                             // (rows)
    std::fill(l, l + rows, 0.0f);                                // (rows)
    // Causal: key tiles starting past the last query's diagonal are skipped entirely.
    const index_t key_end = causal ? std::clamp(i0 + rows + offset, index_t{0}, Nk) : Nk;

    for (index_t j0 = 0; j0 < key_end; j0 += Bc) {               // key/value tile K_j, V_j
      const index_t cols = std::min(Bc, key_end - j0);
      const float* Kj = K + j0 * d;                              // (cols, d)
      const float* Vj = V + j0 * d;                              // (cols, d)
      for (index_t r = 0; r < rows; ++r) {                       // S = Q_i K_j^T * scale
        const index_t diagonal = i0 + r + offset - j0;           // () last column row r sees
        for (index_t c = 0; c < cols; ++c) {                     // (rows, cols)
          float dot = 0.0f;
          for (index_t e = 0; e < d; ++e) dot += Qi[r * d + e] * Kj[c * d + e];
          S[r * Bc + c] = causal && c > diagonal ? neg_inf : dot * scale;  // causal mask
        }
      }
      for (index_t r = 0; r < rows; ++r) {                       // online softmax, row by row
        float* Sr = S + r * Bc;                                  // (cols) this row of S
        const float m_new = std::max(m[r], *std::max_element(Sr, Sr + cols));  // ()
        if (m_new == neg_inf) {                                  // no visible key yet:
          std::fill(Sr, Sr + cols, 0.0f);                        // P = 0 (cols), O and l stay 0
          continue;
        }
        const float alpha = std::exp(m[r] - m_new);              // () = exp(m_old - m_new)
        float row_sum = 0.0f;
        for (index_t c = 0; c < cols; ++c)                       // P = exp(S - m_new) (cols)
          row_sum += Sr[c] = std::exp(Sr[c] - m_new);
        l[r] = alpha * l[r] + row_sum;                           // ()
        m[r] = m_new;                                            // ()
        for (index_t e = 0; e < d; ++e) Oi[r * d + e] *= alpha;  // O *= exp(m_old - m_new) (d)
      }
      for (index_t r = 0; r < rows; ++r)                         // O += P V_j
        for (index_t c = 0; c < cols; ++c)                       // (rows, d)
          for (index_t e = 0; e < d; ++e) Oi[r * d + e] += S[r * Bc + c] * Vj[c * d + e];
    }

    for (index_t r = 0; r < rows; ++r) {                         // O_i /= l, write O_i, LSE_i
      const bool sees_a_key = l[r] > 0.0f;
      for (index_t e = 0; e < d; ++e)                            // (d)
        O[(i0 + r) * d + e] = sees_a_key ? Oi[r * d + e] / l[r] : 0.0f;
      LSE[i0 + r] = sees_a_key ? m[r] + std::log(l[r]) : neg_inf;  // ()
    }
  }
}

}  // namespace flash_minimal

#ifndef FLASH_MINIMAL_NO_MAIN
// The larger of two errors, where NaN counts as the largest (std::max would drop it).
static double worse(double worst, double err) {
  return std::isnan(worst) || std::isnan(err) ? std::nan("") : std::max(worst, err);
}

// Runs a small random problem against a naive attention (full score matrix, in double).
int main() {
  constexpr std::size_t Nq = 100, Nk = 150, d = 64;  // not multiples of Br, Bc: partial tiles
  constexpr double tolerance = 2e-5;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> Q(Nq * d), K(Nk * d), V(Nk * d), O(Nq * d), LSE(Nq);
  for (auto* x : {&Q, &K, &V}) std::generate(x->begin(), x->end(), [&] { return normal(rng); });

  bool ok = true;
  for (bool causal : {false, true}) {
    flash_minimal::flash_forward(Q.data(), K.data(), V.data(), O.data(), LSE.data(), Nq, Nk, d,
                                 scale, causal);
    double max_err_o = 0.0, max_err_lse = 0.0;
    std::vector<double> s(Nk);
    for (std::size_t i = 0; i < Nq; ++i) {
      const std::size_t keys = causal ? i + 1 + Nk - Nq : Nk;  // Nk >= Nq: every row sees one
      double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (std::size_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (std::size_t e = 0; e < d; ++e) dot += double(Q[i * d + e]) * double(K[j * d + e]);
        m = std::max(m, s[j] = dot * scale);
      }
      for (std::size_t j = 0; j < keys; ++j) sum += s[j] = std::exp(s[j] - m);
      for (std::size_t e = 0; e < d; ++e) {
        double acc = 0.0;
        for (std::size_t j = 0; j < keys; ++j) acc += s[j] * double(V[j * d + e]);
        max_err_o = worse(max_err_o, std::abs(acc / sum - double(O[i * d + e])));
      }
      max_err_lse = worse(max_err_lse, std::abs(m + std::log(sum) - double(LSE[i])));
    }
    const bool pass = max_err_o < tolerance && max_err_lse < tolerance;
    std::printf("Nq=%zu Nk=%zu d=%zu causal=%d: max |O - ref| = %.2e, max |LSE - ref| = %.2e %s\n",
                Nq, Nk, d, int(causal), max_err_o, max_err_lse, pass ? "ok" : "FAILED");
    ok = ok && pass;
  }
  return ok ? 0 : 1;
}
#endif
