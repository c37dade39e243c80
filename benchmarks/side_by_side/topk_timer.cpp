// benchmarks/side_by_side/topk_timer.cpp: top-k sparse decode (forward_paged_topk, issue #33
// item 2) against dense decode, paired in one process (each repetition runs the three calls,
// rotating which goes first, each after reading FLUSH_MB MiB so that K/V come from memory):
// the median and min-max of R repetitions of each, the medians of the per-repetition ratios,
// and the gathered K/V bytes per second of the top-k call. No Google Benchmark, so it builds
// on the lent Xeon with g++ alone:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/topk_timer.cpp -o t
//   ./t WORKLOAD THREADS REPEATS [BATCH]      (THREADS 0: OMP_NUM_THREADS; FLUSH_MB=0: no flush)
//
//   gqa  bf16 paged cache (pages of 64), context 32k, Hq 32 / Hkv 8, d 128, 2048 keys chosen at
//        random per sequence (random order, as an indexer's top-k comes).
//   mla  DeepSeek V3.2-like: Hq 128 / Hkv 1, d 576 / dv 512, context 32k, topk 2048.
// Each prints: dense over the full context (full), dense over a 2048-key cache (dense2k), and
// top-k; "topk/full" (ideal: 2048 / 32768 = 0.0625) and "topk/dense2k" (ideal: ~1.0, the
// gathered rows cost what contiguous ones do) paired ratios; topk's GB/s of gathered K/V.
#include <tileattn/tileattn.hpp>

#include "timing.hpp"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using side_by_side::median;

using tileattn::bf16;
using tileattn::index_t;
constexpr index_t page = 64, context = 32768, topk = 2048;

std::vector<bf16> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<bf16> x(n);
  for (bf16& e : x) e = tileattn::from_float<bf16>(normal(rng));
  return x;
}

/// Reads `bytes` of a buffer larger than the last-level cache: K/V then come from memory.
void flush(std::vector<char>& buffer) {
  volatile char sink = 0;
  for (std::size_t i = 0; i < buffer.size(); i += 64) sink = static_cast<char>(sink + buffer[i]);
}

/// Seconds of one call of f, the caches flushed first.
double seconds(const std::function<void()>& f, std::vector<char>& buffer) {
  flush(buffer);
  return side_by_side::seconds(f);
}

std::string summary(const std::vector<double>& v, double unit, const char* what) {
  char text[96];
  std::snprintf(text, sizeof text, "%.4g %s (%.4g-%.4g)", median(v) * unit, what,
                *std::min_element(v.begin(), v.end()) * unit, *std::max_element(v.begin(), v.end()) * unit);
  return text;
}

/// A paged bf16 cache of `batch` sequences of `len` keys in shuffled pages, one query token each.
struct Cache {
  index_t batch, len, hq, hkv, d, dv, pages, max_pages;
  std::vector<bf16> q, k, v, o;
  std::vector<float> lse;
  std::vector<std::int32_t> table, seqlens;
  Cache(index_t b, index_t n, index_t heads_q, index_t heads_kv, index_t dim, index_t dim_v)
      : batch(b), len(n), hq(heads_q), hkv(heads_kv), d(dim), dv(dim_v), max_pages((n + page - 1) / page) {
    pages = batch * max_pages;
    table.resize(static_cast<std::size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    seqlens.assign(static_cast<std::size_t>(batch), static_cast<std::int32_t>(len));
    q = random_values(static_cast<std::size_t>(batch * hq * d), 1);
    k = random_values(static_cast<std::size_t>(pages * page * hkv * d), 2);
    v = random_values(static_cast<std::size_t>(pages * page * hkv * dv), 3);
    o.assign(static_cast<std::size_t>(batch * hq * dv), bf16{});
    lse.assign(static_cast<std::size_t>(batch * hq), 0.0f);
  }
  auto args() {
    return std::make_tuple(tileattn::make_bshd<const bf16>(q.data(), batch, 1, hq, d),
                           tileattn::make_bshd<const bf16>(k.data(), pages, page, hkv, d),
                           tileattn::make_bshd<const bf16>(v.data(), pages, page, hkv, dv),
                           tileattn::make_block_table(table.data(), batch, max_pages));
  }
  void dense(const tileattn::PagedOptions& options) {
    auto [qv, kv, vv, bt] = args();
    tileattn::forward_paged(qv, kv, vv, bt, seqlens, tileattn::make_bshd(o.data(), batch, 1, hq, dv),
                            tileattn::make_lse(lse.data(), batch, hq, 1), options);
  }
  void sparse(const std::vector<std::int32_t>& idx, const tileattn::PagedOptions& options) {
    auto [qv, kv, vv, bt] = args();
    tileattn::forward_paged_topk(qv, kv, vv, bt, seqlens, tileattn::make_topk_indices(idx.data(), batch, 1, topk),
                                 tileattn::make_bshd(o.data(), batch, 1, hq, dv),
                                 tileattn::make_lse(lse.data(), batch, hq, 1), options);
  }
};

void run(const char* name, index_t batch, index_t hq, index_t hkv, index_t d, index_t dv, int threads, int repeats) {
  Cache full(batch, context, hq, hkv, d, dv), small(batch, topk, hq, hkv, d, dv);
  small.q = full.q;
  std::vector<std::int32_t> idx;
  std::mt19937 rng(11);
  for (index_t b = 0; b < batch; ++b) {
    std::vector<std::int32_t> keys(static_cast<std::size_t>(context));
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), rng);
    idx.insert(idx.end(), keys.begin(), keys.begin() + topk);
  }
  tileattn::PagedOptions options;
  options.execution.num_threads = threads;
  const char* flush_env = std::getenv("FLUSH_MB");
  std::vector<char> buffer(static_cast<std::size_t>(flush_env ? std::atol(flush_env) : 512) << 20, 1);
  const std::function<void()> calls[3] = {[&] { full.dense(options); }, [&] { small.dense(options); },
                                          [&] { full.sparse(idx, options); }};
  for (const auto& call : calls) call();  // warm: scratch, first touch
  std::vector<double> t[3], to_full, to_small;
  for (int r = 0; r < repeats; ++r) {
    double s[3];
    for (int c = 0; c < 3; ++c) s[(r + c) % 3] = seconds(calls[(r + c) % 3], buffer);
    for (int c = 0; c < 3; ++c) t[c].push_back(s[c]);
    to_full.push_back(s[2] / s[0]);
    to_small.push_back(s[2] / s[1]);
  }
  const double gathered = static_cast<double>(batch * topk * hkv * (d + dv) * 2);
  std::vector<double> rate;
  for (double s : t[2]) rate.push_back(gathered / s);
  std::printf("%-4s B %lld Hq %lld Hkv %lld d %lld/%lld threads %d, %d runs: full %s  dense2k %s  topk %s\n", name,
              static_cast<long long>(batch), static_cast<long long>(hq), static_cast<long long>(hkv),
              static_cast<long long>(d), static_cast<long long>(dv), threads, repeats, summary(t[0], 1e3, "ms").c_str(),
              summary(t[1], 1e3, "ms").c_str(), summary(t[2], 1e3, "ms").c_str());
  std::printf("     topk/full %s  topk/dense2k %s  topk gathered K/V %s\n", summary(to_full, 1, "").c_str(),
              summary(to_small, 1, "").c_str(), summary(rate, 1e-9, "GB/s").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s gqa|mla THREADS REPEATS [BATCH]\n", argv[0]);
    return 2;
  }
  const std::string w = argv[1];
  int threads = std::atoi(argv[2]);
  if (threads <= 0 && std::getenv("OMP_NUM_THREADS")) threads = std::atoi(std::getenv("OMP_NUM_THREADS"));
  const int repeats = std::max(1, std::atoi(argv[3]));
  const index_t batch = argc > 4 ? std::atoi(argv[4]) : 1;
  if (w == "gqa") run("gqa", batch, 32, 8, 128, 128, threads, repeats);
  else if (w == "mla") run("mla", batch, 128, 1, 576, 512, threads, repeats);
  else return 2;
  return 0;
}
