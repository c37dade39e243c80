// examples/flash_backward_minimal.cpp: a self-contained FlashAttention-2 backward for one head,
// in plain C++20 (standard library only), written to be read next to Algorithm 2 of the paper.
//
//   g++ -std=c++20 -O2 flash_backward_minimal.cpp -o flash_backward && ./flash_backward
//
// It includes flash_forward_minimal.cpp, so keep the two side by side: the backward takes
// index_t, Br, Bc and neg_inf from it, and main() the forward's O and LSE.
// Q, O, dO and dQ are [Nq, d], K, V, dK and dV are [Nk, d], all row-major float; LSE is [Nq].
// The forward saved only O and LSE = log(rowsum(exp(S))), not the Nq x Nk matrix P, so the
// backward rebuilds P one (Br, Bc) tile at a time as P = exp(S - LSE): no running max and no
// rescaling are needed, since LSE already normalizes each row. With D = rowsum(dO * O):
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = scale dS K,   dK = scale dS^T Q.
// The outer loop walks key/value tiles K_j, V_j of Bc rows, whose dK_j and dV_j stay on chip;
// the inner loop walks query tiles Q_i of Br rows, and dQ_i is read, updated and written back
// to main memory ("HBM") once per (i, j) pair. The paper writes S = Q K^T and leaves the
// softmax scale out; here S = scale * Q K^T, so dQ and dK carry a factor of scale.
// "line N" in the comments is line N of Algorithm 2.
#ifndef FLASH_MINIMAL_NO_MAIN
#define FLASH_MINIMAL_NO_MAIN        // the forward's main() is not wanted here...
#define FLASH_BACKWARD_MINIMAL_MAIN  // ...but this file's own main() is
#endif
#include "flash_forward_minimal.cpp"  // flash_minimal::flash_forward, for O and LSE

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace flash_minimal {

/// dQ, dK, dV of O = softmax(scale * Q K^T) V for one head, given the forward's O and LSE and
/// the gradient dO of the loss with respect to O. `causal` must match the forward: query i
/// sees key j iff j <= i + Nk - Nq (bottom-right aligned). A query that sees no key
/// (LSE = -inf) gets dQ = 0 and adds nothing to dK and dV; a key no query sees gets dK = dV = 0.
inline void flash_backward(const float* Q, const float* K, const float* V, const float* O,
                           const float* LSE, const float* dO, float* dQ, float* dK, float* dV,
                           index_t Nq, index_t Nk, index_t d, float scale, bool causal) {
  const index_t offset = Nk - Nq;  // causal: query i sees key j iff j <= i + offset
  // Lines 3-4: dQ = 0 in HBM, and the preprocessing D = rowsum(dO * O), also kept in HBM.
  // (D_i = sum_j P_ij dP_ij, the term the softmax's Jacobian subtracts, computed from O
  // alone: dO_i . O_i = dO_i . sum_j P_ij V_j = sum_j P_ij (dO_i . V_j).)
  std::fill(dQ, dQ + Nq * d, 0.0f);                              // (Nq, d)
  std::vector<float> D(static_cast<std::size_t>(Nq));            // (Nq)
  for (index_t i = 0; i < Nq; ++i) {
    float dot = 0.0f;
    for (index_t e = 0; e < d; ++e) dot += dO[i * d + e] * O[i * d + e];
    D[static_cast<std::size_t>(i)] = dot;
  }
  // The on-chip working set of one key/value tile (SRAM on a GPU, L1/L2 cache here).
  std::vector<float> sram(static_cast<std::size_t>(2 * Br * Bc + 2 * Bc * d));
  float* P = sram.data();               // (Br, Bc) probabilities P, rebuilt from LSE
  float* dS = P + Br * Bc;              // (Br, Bc) dP, then dS
  float* dKj = dS + Br * Bc;            // (Bc, d)  dK accumulator of the key tile
  float* dVj = dKj + Bc * d;            // (Bc, d)  dV accumulator of the key tile

  for (index_t j0 = 0; j0 < Nk; j0 += Bc) {                     // line 5: key/value tile j
    const index_t cols = std::min(Bc, Nk - j0);
    const float* Kj = K + j0 * d;                                // line 6: (cols, d)
    const float* Vj = V + j0 * d;                                //         (cols, d)
    std::fill(dKj, dKj + cols * d, 0.0f);                        // line 7: (cols, d)
    std::fill(dVj, dVj + cols * d, 0.0f);                        //         (cols, d)
    // Causal: key j0 is first seen by query j0 - offset, so the query tiles above the one
    // holding that query see none of this tile and are skipped entirely.
    const index_t first_query = causal ? std::clamp(j0 - offset, index_t{0}, Nq) : 0;

    for (index_t i0 = first_query / Br * Br; i0 < Nq; i0 += Br) {  // line 8: query tile i
      const index_t rows = std::min(Br, Nq - i0);
      const float* Qi = Q + i0 * d;                              // line 9: (rows, d)
      const float* dOi = dO + i0 * d;                            //         (rows, d)
      const float* Li = LSE + i0;                                //         (rows)
      const float* Di = D.data() + i0;                           //         (rows)
      float* dQi = dQ + i0 * d;                                  //         (rows, d), in HBM
      for (index_t r = 0; r < rows; ++r) {                       // lines 10-11: S = scale Q_i K_j^T,
        const index_t diagonal = i0 + r + offset - j0;           //   P = exp(S - L_i) (rows, cols)
        for (index_t c = 0; c < cols; ++c) {
          // Masked keys, and every key of a row that sees none (L = -inf, where
          // exp(S - L) would be exp(+inf) or NaN), get P = 0.
          if ((causal && c > diagonal) || Li[r] == neg_inf) {
            P[r * Bc + c] = 0.0f;
            continue;
          }
          float dot = 0.0f;
          for (index_t e = 0; e < d; ++e) dot += Qi[r * d + e] * Kj[c * d + e];
          P[r * Bc + c] = std::exp(dot * scale - Li[r]);
        }
      }
      for (index_t r = 0; r < rows; ++r)                         // line 12: dV_j += P^T dO_i
        for (index_t c = 0; c < cols; ++c)                       // (cols, d)
          for (index_t e = 0; e < d; ++e) dVj[c * d + e] += P[r * Bc + c] * dOi[r * d + e];
      for (index_t r = 0; r < rows; ++r) {                       // line 13: dP = dO_i V_j^T,
        for (index_t c = 0; c < cols; ++c) {                     // line 14: dS = P * (dP - D_i)
          float dP = 0.0f;                                       // (rows, cols)
          for (index_t e = 0; e < d; ++e) dP += dOi[r * d + e] * Vj[c * d + e];
          dS[r * Bc + c] = P[r * Bc + c] * (dP - Di[r]);
        }
      }
      for (index_t r = 0; r < rows; ++r)                         // line 15: dQ_i += scale dS K_j
        for (index_t c = 0; c < cols; ++c)                       // (rows, d), back to HBM
          for (index_t e = 0; e < d; ++e) dQi[r * d + e] += scale * dS[r * Bc + c] * Kj[c * d + e];
      for (index_t r = 0; r < rows; ++r)                         // line 16: dK_j += scale dS^T Q_i
        for (index_t c = 0; c < cols; ++c)                       // (cols, d)
          for (index_t e = 0; e < d; ++e) dKj[c * d + e] += scale * dS[r * Bc + c] * Qi[r * d + e];
    }

    std::copy(dKj, dKj + cols * d, dK + j0 * d);                 // line 18: write dK_j, dV_j
    std::copy(dVj, dVj + cols * d, dV + j0 * d);                 // (cols, d) each
  }
}

}  // namespace flash_minimal

#ifdef FLASH_BACKWARD_MINIMAL_MAIN
namespace {

// The larger of two errors, where NaN counts as the largest (std::max would drop it).
double worse(double worst, double err) {
  return std::isnan(worst) || std::isnan(err) ? std::nan("") : std::max(worst, err);
}

struct Gradients {
  std::vector<double> dQ, dK, dV;
};

// The textbook backward in double: S, P, dP and dS as whole Nq x Nk matrices, and
// D = rowsum(P * dP) straight from its definition (not through O).
Gradients naive_backward(const std::vector<float>& Q, const std::vector<float>& K,
                         const std::vector<float>& V, const std::vector<float>& dO, std::size_t Nq,
                         std::size_t Nk, std::size_t d, double scale, bool causal) {
  std::vector<double> P(Nq * Nk, 0.0), dS(Nq * Nk, 0.0);
  Gradients g{std::vector<double>(Nq * d), std::vector<double>(Nk * d), std::vector<double>(Nk * d)};
  for (std::size_t i = 0; i < Nq; ++i) {  // P = softmax(scale Q K^T), masked keys get P = 0
    const std::ptrdiff_t seen = causal ? std::ptrdiff_t(i + 1 + Nk) - std::ptrdiff_t(Nq) : std::ptrdiff_t(Nk);
    const std::size_t keys = std::size_t(std::clamp<std::ptrdiff_t>(seen, 0, std::ptrdiff_t(Nk)));
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    double* Pi = &P[i * Nk];
    for (std::size_t j = 0; j < keys; ++j) {
      double dot = 0.0;
      for (std::size_t e = 0; e < d; ++e) dot += double(Q[i * d + e]) * double(K[j * d + e]);
      m = std::max(m, Pi[j] = dot * scale);
    }
    for (std::size_t j = 0; j < keys; ++j) sum += Pi[j] = std::exp(Pi[j] - m);
    for (std::size_t j = 0; j < keys; ++j) Pi[j] /= sum;
  }
  for (std::size_t i = 0; i < Nq; ++i) {  // dP = dO V^T, dS = P * (dP - rowsum(P * dP))
    double D = 0.0;
    for (std::size_t j = 0; j < Nk; ++j) {
      double dP = 0.0;
      for (std::size_t e = 0; e < d; ++e) dP += double(dO[i * d + e]) * double(V[j * d + e]);
      dS[i * Nk + j] = dP;
      D += P[i * Nk + j] * dP;
    }
    for (std::size_t j = 0; j < Nk; ++j) dS[i * Nk + j] = P[i * Nk + j] * (dS[i * Nk + j] - D);
  }
  for (std::size_t i = 0; i < Nq; ++i)  // dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q
    for (std::size_t j = 0; j < Nk; ++j)
      for (std::size_t e = 0; e < d; ++e) {
        g.dV[j * d + e] += P[i * Nk + j] * double(dO[i * d + e]);
        g.dQ[i * d + e] += scale * dS[i * Nk + j] * double(K[j * d + e]);
        g.dK[j * d + e] += scale * dS[i * Nk + j] * double(Q[i * d + e]);
      }
  return g;
}

double max_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double worst = 0.0;
  for (std::size_t n = 0; n < x.size(); ++n) worst = worse(worst, std::abs(double(x[n]) - ref[n]));
  return worst;
}

}  // namespace

// Runs small random problems against the naive backward above (full matrices, in double).
int main() {
  constexpr std::size_t d = 64;
  // Bound on max |error| of dQ, dK and dV. fp32 accumulation measures below 3e-6 here, for
  // gradients up to about 4 in size; a typical bug (a missing scale, a top-left or
  // off-by-one causal mask, D = 0, P instead of P^T) is off by 2e-1 or more.
  constexpr double tolerance = 5e-5;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  bool ok = true;
  // Neither size a multiple of Br or Bc (partial tiles); with Nq > Nk, causal rows
  // 0 .. Nq - Nk - 1 see no key at all.
  for (const auto& [Nq, Nk] : {std::pair<std::size_t, std::size_t>{100, 150}, {150, 100}}) {
    std::vector<float> Q(Nq * d), K(Nk * d), V(Nk * d), dO(Nq * d), O(Nq * d), LSE(Nq);
    std::vector<float> dQ(Nq * d), dK(Nk * d), dV(Nk * d);
    for (auto* x : {&Q, &K, &V, &dO})
      std::generate(x->begin(), x->end(), [&] { return normal(rng); });
    for (bool causal : {false, true}) {
      const auto n_q = std::ptrdiff_t(Nq), n_k = std::ptrdiff_t(Nk), n_d = std::ptrdiff_t(d);
      flash_minimal::flash_forward(Q.data(), K.data(), V.data(), O.data(), LSE.data(), n_q, n_k,
                                   n_d, scale, causal);
      flash_minimal::flash_backward(Q.data(), K.data(), V.data(), O.data(), LSE.data(), dO.data(),
                                    dQ.data(), dK.data(), dV.data(), n_q, n_k, n_d, scale, causal);
      const Gradients ref = naive_backward(Q, K, V, dO, Nq, Nk, d, scale, causal);
      const double err_q = max_error(dQ, ref.dQ), err_k = max_error(dK, ref.dK),
                   err_v = max_error(dV, ref.dV);
      const bool pass = err_q < tolerance && err_k < tolerance && err_v < tolerance;
      std::printf("Nq=%zu Nk=%zu d=%zu causal=%d: max |dQ - ref| = %.2e, max |dK - ref| = %.2e, "
                  "max |dV - ref| = %.2e %s\n",
                  Nq, Nk, d, int(causal), err_q, err_k, err_v, pass ? "ok" : "FAILED");
      ok = ok && pass;
    }
  }
  return ok ? 0 : 1;
}
#endif
