// benchmarks/side_by_side/flex_timer.cpp: times tileattn::forward_flex on one of bench_flex's
// three workloads (B 1, H 16, d 128): median, min and max GFLOP/s of R runs after one warm-up,
// counting 4 d FLOPs per visible score (torch_flex.py's count; flex.sh runs both):
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/flex_timer.cpp
//   ./a.out WORKLOAD THREADS REPEATS [fp32|bf16]     WORKLOAD: causal | document | block_sparse
//
//   causal        N 4096, flex::causal (top-left, q_idx >= kv_idx)
//   document      8 documents of 1024 packed into N 8192, flex::document on the doc-id array
//   block_sparse  N 8192, flex::block_sparse on a layout of 128 x 128 blocks: every diagonal
//                 block, then distinct blocks drawn by a 64-bit LCG (seed 2026; torch_flex.py
//                 draws the same ones) until 10% of all blocks are set
//
// FLEX_SCALE=s (env, default 1) scales every length by s, rounded to a multiple of 128 (at
// least 128): FLEX_SCALE=0.25 is a quick smoke test. The block mask (128 x 128 blocks) is built
// once, outside the timing. The visible scores are counted by evaluating the mask once on
// every (query, key); the line gives that count and `blocks`, a 32-bit FNV-1a hash of the
// block layout (1 per 128 x 128 block with a visible score), which torch_flex.py prints too:
// equal values, the same mask. Inputs are N(0, 1) from a fixed seed, rounded to the type; O is
// the type, no LSE.
#include <tileattn/tileattn.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

using tileattn::index_t;
namespace flex = tileattn::flex;

constexpr index_t heads = 16, dim = 128, block = 128;

/// n scaled by FLEX_SCALE, rounded to a multiple of 128, at least 128 (torch_flex.py's scaled()).
index_t scaled(index_t n) {
  const char* s = std::getenv("FLEX_SCALE");
  const double f = s && *s ? std::atof(s) : 1.0;
  return std::max<index_t>(block, static_cast<index_t>(static_cast<double>(n) * f / block + 0.5) * block);
}

/// The block-sparse layout (nb x nb, row-major): the diagonal, then distinct blocks drawn by
/// the LCG state = state * 6364136223846793005 + 1442695040888963407 (mod 2^64), block =
/// (state >> 33) mod nb^2, until round(10% of nb^2) are set. torch_flex.py's layout() is this.
std::vector<std::uint8_t> sparse_layout(index_t nb) {
  const auto total = static_cast<std::uint64_t>(nb * nb);
  std::vector<std::uint8_t> l(total, 0);
  for (index_t b = 0; b < nb; ++b) l[static_cast<std::size_t>(b * nb + b)] = 1;
  const auto target = static_cast<std::uint64_t>(0.10 * static_cast<double>(total) + 0.5);
  std::uint64_t state = 2026, set = static_cast<std::uint64_t>(nb);
  while (set < target) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    auto& e = l[static_cast<std::size_t>((state >> 33) % total)];
    if (!e) e = 1, ++set;
  }
  return l;
}

struct Count {
  double visible = 0;
  std::uint32_t blocks = 0;  // FNV-1a of the nonempty-block layout
};

/// Evaluates the mask once on every (query, key) of an n x n problem.
template <class Mask>
Count count_visible(const Mask& mask, index_t n) {
  const index_t nb = n / block;
  std::vector<std::uint8_t> nonempty(static_cast<std::size_t>(nb * nb), 0);
  long long visible = 0;
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j)
      if (mask(0, 0, i, j)) {
        ++visible;
        nonempty[static_cast<std::size_t>(i / block * nb + j / block)] = 1;
      }
  std::uint32_t h = 2166136261u;
  for (std::uint8_t b : nonempty) h = (h ^ b) * 16777619u;
  return {static_cast<double>(visible), h};
}

template <class T, class Mask, class Round>
int time_flex(const char* workload, index_t n, const Mask& mask, int threads, int repeats, const char* type,
              Round round) {
  using namespace tileattn;
  const Count c = count_visible(mask, n);
  std::vector<T> q(n * heads * dim), k(q.size()), v(q.size()), o(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto* x : {&q, &k, &v}) for (T& e : *x) e = round(nd(rng));
  ForwardOptions opts;
  opts.execution = {Backend::openmp, threads};
  const auto blocks = create_block_mask(mask, 1, 1, n, n, {block, block}, opts.execution);
  std::vector<double> s;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    forward_flex(make_bshd<const T>(q.data(), 1, n, heads, dim), make_bshd<const T>(k.data(), 1, n, heads, dim),
                 make_bshd<const T>(v.data(), 1, n, heads, dim), make_bshd(o.data(), 1, n, heads, dim),
                 flex::no_score_mod{}, blocks, opts);
    if (r > 0) s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  const double flops = 4.0 * dim * heads * c.visible;
  std::printf("N %ld d %ld H %ld/%ld %s visible %.0f blocks %08x threads %2d%s%s: GFLOP/s median %7.1f min %7.1f "
              "max %7.1f\n",
              static_cast<long>(n), static_cast<long>(dim), static_cast<long>(heads), static_cast<long>(heads),
              workload, c.visible, c.blocks, threads, *type ? " " : "", type, flops / s[s.size() / 2] * 1e-9,
              flops / s.back() * 1e-9, flops / s.front() * 1e-9);
  return 0;
}

template <class T, class Round>
int run(const std::string& workload, int threads, int repeats, const char* type, Round round) {
  if (workload == "causal") return time_flex<T>("causal", scaled(4096), flex::causal{}, threads, repeats, type, round);
  if (workload == "document") {
    const index_t doc_len = scaled(1024), n = 8 * doc_len;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / doc_len);
    return time_flex<T>("document", n, flex::document{ids}, threads, repeats, type, round);
  }
  if (workload == "block_sparse") {
    const index_t n = scaled(8192), nb = n / block;
    const std::vector<std::uint8_t> layout = sparse_layout(nb);
    return time_flex<T>("block_sparse", n, flex::block_sparse{layout, nb, block}, threads, repeats, type, round);
  }
  std::fprintf(stderr, "unknown workload '%s' (causal, document or block_sparse)\n", workload.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s causal|document|block_sparse THREADS REPEATS [fp32|bf16]\n", argv[0]);
    return 2;
  }
  const std::string workload = argv[1];
  const int threads = std::atoi(argv[2]), repeats = std::atoi(argv[3]);
  const std::string type = argc > 4 ? argv[4] : "fp32";
  if (repeats < 1) {
    std::fprintf(stderr, "REPEATS must be >= 1\n");
    return 2;
  }
  if (type == "fp32") return run<float>(workload, threads, repeats, "", [](float x) { return x; });
  if (type == "bf16")
    return run<tileattn::bf16>(workload, threads, repeats, "bf16", [](float x) { return tileattn::bf16(x); });
  std::fprintf(stderr, "unknown type '%s' (fp32 or bf16)\n", type.c_str());
  return 2;
}
