// examples/check_flash_backward_minimal.cpp: checks the copyable example kernel of
// flash_backward_minimal.cpp against tileattn's double-precision reference gradients
// (tests/reference/naive_backward.hpp, itself checked against finite differences of the
// reference forward) on random N(0,1) inputs of awkward sizes, causal and not (Nq < Nk,
// Nq > Nk where causal rows see no key, 1 row, 1 key, tile remainders).
//
// The kernel reads O and LSE of the double reference forward, rounded to float, so a forward
// bug can neither hide nor cause an error here (check_flash_forward_minimal.cpp checks it).
#define FLASH_MINIMAL_NO_MAIN
#include "flash_backward_minimal.cpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "reference/naive_attention.hpp"
#include "reference/naive_backward.hpp"
#include "tileattn/core/strided_view.hpp"

namespace {

// Bound on max |error| of dQ, dK and dV, for gradients up to ~10 in size. fp32 accumulation
// over at most 1000 queries and 333 keys of N(0,1) data measures below 4e-6 (a 1000 x 1000
// case measured below 6e-6, but took 20 s under the sanitizers in CI). Bugs injected one at
// a time into the kernel, measured with this check when it had that 1000 x 1000 case (worst
// error; cases failed of 28, 14 of them causal):
//   dQ without the factor scale         2e+1  22 (all but Nk = 1, where dQ = 0)
//   S = Q K^T without scale             2e+15 28
//   top-left causal mask                1e+2   7 (the causal cases with Nq != Nk, Nk > 1)
//   off-by-one mask, j < i + Nk - Nq    3e+0  14 (every causal case)
//   D = 0 (no preprocessing)            8e+0  28
//   D = rowsum(dO)                      2e+1  28
//   causal skip one query tile late     5e+0   6 (causal with Nq > Br, but 33 x 1)
//   dV += P dO instead of P^T dO        1e+1  25
// Every failing case is off by 6e-3 or more, save one: D = 0 on Nq = 1, whose one D happens
// to be small, is off by 1.3e-4, still 2.6 times the bound. Dropping the LSE = -inf guard
// alone changes nothing: the causal mask has already masked every key of such a row (the
// guard keeps P finite whatever LSE a caller passes).
constexpr double max_abs_error = 5e-5;

struct Shape {
  tileattn::index_t nq, nk, d;
};

// Max |x - ref| over the entries; NaN counts as infinite.
double max_error(const std::vector<float>& x, const std::vector<double>& ref) {
  double worst = 0.0;
  for (std::size_t n = 0; n < x.size(); ++n) {
    const double err = std::abs(double(x[n]) - ref[n]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

// Runs one case; prints its line and returns whether all three errors are below the bound.
bool check(const Shape& s, bool causal, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(s.nq * s.d), k(s.nk * s.d), v(s.nk * s.d), dout(s.nq * s.d);
  for (auto* x : {&q, &k, &v, &dout})
    std::generate(x->begin(), x->end(), [&] { return normal(rng); });
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  const auto view = [](const std::vector<float>& x, tileattn::index_t rows, tileattn::index_t d) {
    return tileattn::make_bshd<const float>(x.data(), 1, rows, 1, d);
  };
  tileattn::reference::Options opt;
  opt.softmax_scale = scale;
  opt.causal = causal;

  // The forward's outputs, as a float forward would hand them over.
  const auto fwd = tileattn::reference::attention(view(q, s.nq, s.d), view(k, s.nk, s.d),
                                                  view(v, s.nk, s.d), opt);
  const std::vector<float> o(fwd.o.begin(), fwd.o.end()), lse(fwd.lse.begin(), fwd.lse.end());
  std::vector<float> dq(s.nq * s.d, NAN), dk(s.nk * s.d, NAN), dv(s.nk * s.d, NAN);  // poisoned
  flash_minimal::flash_backward(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                                dq.data(), dk.data(), dv.data(), s.nq, s.nk, s.d, scale, causal);

  const auto ref = tileattn::reference::attention_backward(
      view(q, s.nq, s.d), view(k, s.nk, s.d), view(v, s.nk, s.d), view(dout, s.nq, s.d), opt);
  const double err_q = max_error(dq, ref.dq), err_k = max_error(dk, ref.dk), err_v = max_error(dv, ref.dv);
  double ref_size = 0.0;
  for (const auto* g : {&ref.dq, &ref.dk, &ref.dv})
    for (double x : *g) ref_size = std::max(ref_size, std::abs(x));
  const bool pass = err_q < max_abs_error && err_k < max_abs_error && err_v < max_abs_error;
  std::printf("%-6s Nq=%-5td Nk=%-5td d=%-4td causal=%d  max |dQ - ref| = %.2e  "
              "max |dK - ref| = %.2e  max |dV - ref| = %.2e  (max |ref| = %.1f)\n",
              pass ? "ok" : "FAILED", s.nq, s.nk, s.d, int(causal), err_q, err_k, err_v, ref_size);
  return pass;
}

}  // namespace

int main() {
  // Br = Bc = 32: 17 is a partial tile, 33 one full tile and a 1-row remainder.
  std::vector<Shape> shapes;
  for (tileattn::index_t nq : {1, 17, 33})
    for (tileattn::index_t nk : {1, 17, 33}) shapes.push_back({nq, nk, nq == nk ? 16 : 8});
  for (const Shape& s : {Shape{127, 203, 64}, Shape{203, 127, 64}, Shape{1, 127, 128},
                         Shape{1000, 333, 64}, Shape{256, 256, 80}})
    shapes.push_back(s);
  std::mt19937 rng(20261122);
  int passed = 0, failed = 0;
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) (check(s, causal, rng) ? passed : failed) += 1;
  if (failed > 0)
    std::printf("error: flash_minimal::flash_backward differs from the reference by %.0e or more\n",
                max_abs_error);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
