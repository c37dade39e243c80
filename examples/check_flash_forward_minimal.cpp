// examples/check_flash_forward_minimal.cpp: checks the copyable example kernel of
// flash_forward_minimal.cpp against tileattn's double-precision reference attention on
// random N(0,1) inputs of awkward sizes, causal and not (Nq < Nk, Nq > Nk, tile remainders).
#define FLASH_MINIMAL_NO_MAIN
#include "flash_forward_minimal.cpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "reference/naive_attention.hpp"
#include "tileattn/core/strided_view.hpp"

namespace {

// Bound on max |error| of O and of LSE. fp32 accumulation over at most 1000 keys of N(0,1)
// data measures below 1e-6; injected bugs (no O rescale, top-left causal, off-by-one mask,
// log2 in the LSE) are off by 5e-2 or more.
constexpr double max_abs_error = 2e-5;

struct Shape {
  tileattn::index_t nq, nk, d;
};

// |a - b| where two equal infinities (a row that sees no key: LSE = -inf) count as exact.
double abs_error(double a, double b) {
  if (a == b) return 0.0;
  const double err = std::abs(a - b);
  return std::isnan(err) ? INFINITY : err;
}

// Runs one case; prints its line and returns whether both errors are below the bound.
bool check(const Shape& s, bool causal, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(s.nq * s.d), k(s.nk * s.d), v(s.nk * s.d);
  for (auto* x : {&q, &k, &v}) std::generate(x->begin(), x->end(), [&] { return normal(rng); });
  std::vector<float> o(s.nq * s.d, NAN), lse(s.nq, NAN);  // poisoned: every entry must be written
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  flash_minimal::flash_forward(q.data(), k.data(), v.data(), o.data(), lse.data(), s.nq, s.nk,
                               s.d, scale, causal);

  const auto ref = tileattn::reference::attention<float>(
      tileattn::make_bshd<const float>(q.data(), 1, s.nq, 1, s.d),
      tileattn::make_bshd<const float>(k.data(), 1, s.nk, 1, s.d),
      tileattn::make_bshd<const float>(v.data(), 1, s.nk, 1, s.d), scale, causal);
  double err_o = 0.0, err_lse = 0.0;
  for (tileattn::index_t i = 0; i < s.nq; ++i) {
    for (tileattn::index_t e = 0; e < s.d; ++e)
      err_o = std::max(err_o, abs_error(o[i * s.d + e], ref.out(0, i, 0, e)));
    err_lse = std::max(err_lse, abs_error(lse[i], ref.log_sum_exp(0, 0, i)));
  }
  const bool pass = err_o < max_abs_error && err_lse < max_abs_error;
  std::printf("%-6s Nq=%-5td Nk=%-5td d=%-4td causal=%d  max |O - ref| = %.2e  "
              "max |LSE - ref| = %.2e\n",
              pass ? "ok" : "FAILED", s.nq, s.nk, s.d, int(causal), err_o, err_lse);
  return pass;
}

}  // namespace

int main() {
  const Shape shapes[] = {{1, 1, 32}, {17, 127, 64}, {127, 17, 64}, {1000, 1000, 128},
                          {256, 256, 80}};
  std::mt19937 rng(20261122);
  int passed = 0, failed = 0;
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) (check(s, causal, rng) ? passed : failed) += 1;
  if (failed > 0)
    std::printf("error: flash_minimal::flash_forward differs from the reference by %.0e or more\n",
                max_abs_error);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
