// benchmarks/sgemm_ceiling.hpp: what a large GEMM reaches on this machine: OpenBLAS sgemm at
// 2048^3, measured in the benchmark's own process (the ceiling the forward is compared to).
#pragma once

#include <cblas.h>

#include <chrono>
#include <map>
#include <vector>

#include "ceilings.hpp"

namespace tileattn::bench {

/// GFLOP/s of OpenBLAS sgemm 2048^3 with `threads` BLAS threads (best of 3). Leaves
/// OpenBLAS single-threaded afterwards, so it never fights the kernels' own threads.
inline double sgemm_gflops(int threads) {
  static std::map<int, double> cache;
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  constexpr int n = 2048;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  const double gflops = detail::best_of(3, [&] {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    return 2.0 * n * n * n / std::chrono::duration<double>(Clock::now() - start).count() * 1e-9;
  });
  openblas_set_num_threads(1);
  return cache[threads] = gflops;
}

}  // namespace tileattn::bench
