// benchmarks/side_by_side/forward_timer.cpp: times tileattn::forward (whichever headers it
// is built against) on one shape: median, min and max GFLOP/s of R runs after one warm-up.
// Standard library only, so an older commit's headers build it too (before / after tables):
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/forward_timer.cpp
//   ./a.out N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS
#include <tileattn/tileattn.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
int main(int argc, char** argv) {
  using namespace tileattn;
  const index_t n = atol(argv[1]), d = atol(argv[2]), hq = atol(argv[3]), hkv = atol(argv[4]);
  const bool causal = atoi(argv[5]);
  const int threads = atoi(argv[6]), repeats = atoi(argv[7]);
  std::vector<float> q(n * hq * d), k(n * hkv * d), v(n * hkv * d), o(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto* x : {&q, &k, &v}) for (float& e : *x) e = nd(rng);
  ForwardOptions opts;
  opts.causal = causal;
  opts.execution = {Backend::openmp, threads};
  std::vector<double> s;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    forward(make_bshd<const float>(q.data(), 1, n, hq, d), make_bshd<const float>(k.data(), 1, n, hkv, d),
            make_bshd<const float>(v.data(), 1, n, hkv, d), make_bshd(o.data(), 1, n, hq, d), opts);
    if (r > 0) s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  const double flops = 4.0 * hq * n * n * d / (causal ? 2 : 1);
  std::printf("N %ld d %ld H %ld/%ld %s threads %2d: GFLOP/s median %7.1f min %7.1f max %7.1f\n", n, d, hq, hkv,
              causal ? "causal" : "full  ", threads, flops / s[s.size() / 2] * 1e-9, flops / s.back() * 1e-9,
              flops / s.front() * 1e-9);
}
