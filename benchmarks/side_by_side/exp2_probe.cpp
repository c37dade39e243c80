// benchmarks/side_by_side/exp2_probe.cpp: the bf16 softmax pass's 2^x (x * scale - shift,
// 2^x, the row sum, bf16 pairs out) in the forms issue 45 compared, on 64 rows of 128 scores
// (one slab of a 128-key tile), ns per score, median of 15 runs on one thread:
//   before       round to nearest, two clamps, degree 4 on [-1/2, 1/2], vscalefps (<= 26bfc22)
//   now          vreduceps, degree 4 on [0, 1], vscalefps masked below 2^-126 (arch/exp2.hpp)
//   degree 3     the same with degree 3 (8.6e-5: not kept, the LSE loses accuracy)
//   clamp+mask   now, with x also clamped at -126 before vscalefps (not kept: 14% slower on Zen 5)
// SD (default 3) is the scores' spread in log2 units: at 300 most results fall below 2^-126,
// where a CPU that makes subnormal floats through microcode assists slows down (the Xeon).
//   g++ -O3 -march=native benchmarks/side_by_side/exp2_probe.cpp && SD=300 taskset -c 2 ./a.out
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BF16__)
namespace {

enum Form { before, now, degree3, clamp_and_mask };

template <Form F>
__m512 exp2(__m512 x) {
  if constexpr (F == before) {
    x = _mm512_max_ps(_mm512_set1_ps(-151.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(128.0f), x);
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.582852945e-03f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.590642989e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402409911e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931241751e-01f));
    return _mm512_scalef_ps(_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)), n);
  } else {
    const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
    if constexpr (F == clamp_and_mask) x = _mm512_max_ps(x, _mm512_set1_ps(-126.0f));
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p;
    if constexpr (F == degree3) {
      p = _mm512_set1_ps(7.7067041999e-02f);
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2764499120e-01f));
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9511678642e-01f));
    } else {
      p = _mm512_set1_ps(1.3426684271e-02f);
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.2242474224e-02f));
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4128020475e-01f));
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9304484490e-01f));
    }
    return _mm512_maskz_scalef_ps(normal, _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f)), x);
  }
}

template <Form F>
[[gnu::noinline]] void softmax_rows(const float* x, int rows, int n, const float* shift, float* sums,
                                    std::uint32_t* pairs) {
  for (int r = 0; r < rows; ++r) {
    const __m512 s = _mm512_set1_ps(-shift[r]), scale = _mm512_set1_ps(1.0f);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 32) {
      const __m512 e0 = exp2<F>(_mm512_fmadd_ps(_mm512_loadu_ps(x + r * n + j), scale, s));
      const __m512 e1 = exp2<F>(_mm512_fmadd_ps(_mm512_loadu_ps(x + r * n + j + 16), scale, s));
      _mm512_storeu_si512(pairs + (r * n + j) / 2, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
      sum0 = _mm512_add_ps(sum0, e0);
      sum1 = _mm512_add_ps(sum1, e1);
    }
    sums[r] = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
  }
}

}  // namespace

int main() {
  constexpr int rows = 64, n = 128, calls = 2000;
  const float spread = std::getenv("SD") ? static_cast<float>(std::atof(std::getenv("SD"))) : 3.0f;
  std::vector<float> x(rows * n), shift(rows), sums(rows);
  std::vector<std::uint32_t> pairs(rows * n / 2);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, spread);
  for (float& v : x) v = nd(rng);
  for (int r = 0; r < rows; ++r) shift[r] = *std::max_element(x.begin() + r * n, x.begin() + (r + 1) * n);
  const auto time = [&](auto rows_fn, const char* name) {
    std::vector<double> t;
    for (int run = 0; run < 15; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) rows_fn(x.data(), rows, n, shift.data(), sums.data(), pairs.data());
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (1.0 * calls * rows * n));
    }
    std::sort(t.begin(), t.end());
    std::printf("  %-11s %.4f ns a score (%.4f-%.4f); row 0's sum %.6f\n", name, t[7] * 1e9, t[0] * 1e9, t[14] * 1e9,
                sums[0]);
  };
  std::printf("bf16 softmax pass, %d x %d scores of spread %g (log2 units):\n", rows, n, spread);
  time(softmax_rows<before>, "before");
  time(softmax_rows<now>, "now");
  time(softmax_rows<degree3>, "degree 3");
  time(softmax_rows<clamp_and_mask>, "clamp+mask");
}
#else
int main() { std::puts("exp2_probe needs AVX-512 F, DQ and BF16 (-march=native on such a CPU)"); }
#endif
