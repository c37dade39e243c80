// benchmarks/side_by_side/decode_timer.cpp: one tileattn paged decode step (forward_paged,
// seqlen_q 1) on B sequences of CTX cached keys in shuffled 16-token pages: median, min and
// max K/V GB/s (bytes in the stored type) of R timed runs after one warm-up, the fraction of
// a streaming read on the same threads (benchmarks/ceilings.hpp) the median reaches, and a
// hash of O (equal hashes across thread counts: bitwise-equal outputs).
//   decode_timer B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../ceilings.hpp"
#include "tileattn/tileattn.hpp"

using tileattn::index_t;

template <class T>
int run(index_t b, index_t ctx, index_t hq, index_t hkv, index_t d, int threads, int repeats) {
  constexpr index_t page = 16;
  const index_t max_pages = (ctx + page - 1) / page, pages = b * max_pages;
  std::vector<T, tileattn::LineAlignedAllocator<T>> k(static_cast<std::size_t>(pages * page * hkv * d)), v(k.size());
  std::vector<T> q(static_cast<std::size_t>(b * hq * d)), o(q.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (auto* x : {&k, &v})
    for (auto& e : *x) e = tileattn::from_float<T>(normal(rng));
  for (auto& e : q) e = tileattn::from_float<T>(normal(rng));
  std::vector<std::int32_t> table(static_cast<std::size_t>(pages)), lens(static_cast<std::size_t>(b), static_cast<std::int32_t>(ctx));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  tileattn::PagedOptions opt;
  opt.execution = {tileattn::Backend::openmp, threads};
  const auto step = [&] {
    tileattn::forward_paged(tileattn::make_bshd<const T>(q.data(), b, 1, hq, d),
                               tileattn::make_bshd<const T>(k.data(), pages, page, hkv, d),
                               tileattn::make_bshd<const T>(v.data(), pages, page, hkv, d),
                               tileattn::make_block_table(table.data(), b, max_pages), lens,
                               tileattn::make_bshd(o.data(), b, 1, hq, d), opt);
  };
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double gb = 2.0 * static_cast<double>(b * ctx * hkv * d) * sizeof(T) * 1e-9;
  std::uint64_t hash = 1469598103934665603ull;
  for (const T& x : o) {
    std::uint16_t bits[sizeof(T) / 2];
    std::memcpy(bits, &x, sizeof(T));
    for (auto w : bits) hash = (hash ^ w) * 1099511628211ull;
  }
  const double median = gb / seconds[seconds.size() / 2];
  std::printf("tileattn decode %s B %ld ctx %ld H %ld/%ld d %ld threads %2d: KV GB/s median %7.2f min %7.2f max %7.2f "
              "of_stream %.2f hash %016llx\n",
              sizeof(T) == 4 ? "fp32" : "bf16", static_cast<long>(b), static_cast<long>(ctx), static_cast<long>(hq),
              static_cast<long>(hkv), static_cast<long>(d), threads, median, gb / seconds.back(), gb / seconds.front(),
              median / tileattn::bench::stream_read_gbps(threads), static_cast<unsigned long long>(hash));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: decode_timer B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16]\n");
    return 2;
  }
  const auto arg = [&](int i) { return static_cast<index_t>(std::atol(argv[i])); };
  const std::string dtype = argc > 8 ? argv[8] : "fp32";
  if (dtype == "bf16") return run<tileattn::bf16>(arg(1), arg(2), arg(3), arg(4), arg(5), static_cast<int>(arg(6)), static_cast<int>(arg(7)));
  return run<float>(arg(1), arg(2), arg(3), arg(4), arg(5), static_cast<int>(arg(6)), static_cast<int>(arg(7)));
}
