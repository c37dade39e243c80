// benchmarks/side_by_side/backward_timer.cpp: times tileattn's forward + backward (a training
// step's attention) on one shape: median, min and max GFLOP/s of R runs after one warm-up,
// the backward credited with 2.5x the forward's FLOPs (3.5x in all, as the FlashAttention
// papers count), and a hash of dQ, dK, dV's bits, so that runs at different thread counts
// show the gradients are bitwise identical.
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/backward_timer.cpp
//   ./a.out N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]
// Inputs Q, K, V, dO are N(0, 1) from a fixed seed, rounded to the type. SCALE=x sets the
// softmax scale (default 1/sqrt(D)); scales that take some |LSE| to 256 or more time the
// backward's row-statistics path (docs/backward.md), which runs the forward once more.
#include <tileattn/tileattn.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

template <class T>
std::uint64_t hash_bits(const std::vector<T>& x, std::uint64_t h) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(x.data());
  for (std::size_t i = 0; i < x.size() * sizeof(T); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

template <class T, class Round>
int time_training(long n, long d, long hq, long hkv, bool causal, int threads, int repeats, const char* type,
                  Round round) {
  using namespace tileattn;
  std::vector<T> q(n * hq * d), k(n * hkv * d), v(n * hkv * d), o(q.size()), dout(q.size());
  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(hq * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto* x : {&q, &k, &v, &dout}) for (T& e : *x) e = round(nd(rng));
  BackwardOptions opts;
  opts.causal = causal;
  opts.execution = {Backend::openmp, threads};
  if (const char* scale = std::getenv("SCALE"); scale && *scale) opts.softmax_scale = std::strtof(scale, nullptr);
  const auto Q = make_bshd<const T>(q.data(), 1, n, hq, d), K = make_bshd<const T>(k.data(), 1, n, hkv, d),
             V = make_bshd<const T>(v.data(), 1, n, hkv, d), dO = make_bshd<const T>(dout.data(), 1, n, hq, d);
  std::vector<double> s;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    forward(Q, K, V, make_bshd(o.data(), 1, n, hq, d), make_lse(lse.data(), 1, hq, n), opts);
    backward(Q, K, V, make_bshd<const T>(o.data(), 1, n, hq, d), make_lse(lse.data(), 1, hq, n), dO,
             make_bshd(dq.data(), 1, n, hq, d), make_bshd(dk.data(), 1, n, hkv, d), make_bshd(dv.data(), 1, n, hkv, d),
             opts);
    if (r > 0) s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  const double flops = 3.5 * 4.0 * hq * n * n * d / (causal ? 2 : 1);
  const std::uint64_t h = hash_bits(dv, hash_bits(dk, hash_bits(dq, 14695981039346656037ull)));
  std::printf("fwd+bwd N %ld d %ld H %ld/%ld %s threads %2d %s: GFLOP/s median %7.1f min %7.1f max %7.1f hash %016llx\n",
              n, d, hq, hkv, causal ? "causal" : "full  ", threads, type, flops / s[s.size() / 2] * 1e-9,
              flops / s.back() * 1e-9, flops / s.front() * 1e-9, static_cast<unsigned long long>(h));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]\n", argv[0]);
    return 2;
  }
  const long n = atol(argv[1]), d = atol(argv[2]), hq = atol(argv[3]), hkv = atol(argv[4]);
  const bool causal = atoi(argv[5]);
  const int threads = atoi(argv[6]), repeats = atoi(argv[7]);
  const std::string type = argc > 8 ? argv[8] : "fp32";
  if (repeats < 1) return 2;
  if (type == "fp32") return time_training<float>(n, d, hq, hkv, causal, threads, repeats, "fp32", [](float x) { return x; });
  if (type == "bf16")
    return time_training<tileattn::bf16>(n, d, hq, hkv, causal, threads, repeats, "bf16",
                                         [](float x) { return tileattn::bf16(x); });
  std::fprintf(stderr, "unknown type '%s' (fp32, bf16)\n", type.c_str());
  return 2;
}
