// benchmarks/side_by_side/q4_timer.cpp: issue #33's 4-bit KV caches, timed against the bf16
// cache they replace (and int8 beside them), paired in one process: a decode step of BATCH
// sequences of CONTEXT keys each (paged, pages of 16, Hq 32, Hkv 8, d 128, Q and O bf16),
// with the caches flushed before every step (FLUSH_MIB of another buffer read), so each
// step streams its K/V from memory as a serving step does. No Google Benchmark, so it builds
// on the lent Xeon with g++ alone:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/q4_timer.cpp -o t
//   ./t THREADS REPEATS BATCH CONTEXTS FLUSH_MIB      (defaults: $OMP_NUM_THREADS or all, 9, 4,
//                                                     4096,16384,32768, 1024)
//
// It prints, per context: the streaming read rate of this binary (a parallel sum over a
// buffer far larger than the caches: the ceiling a decode step can reach), then for each
// format the median step time and its range, the K/V bytes the step read (the tiles' IO
// counters) and that rate as a fraction of the streaming one, and the paired ratio of each
// format's step to the bf16 step (median and range over the REPEATS pairs).
// Targets (issue #33): q4_0 step <= 0.35x bf16's; q4_0 bytes / time >= 0.7 of streaming.
#include <tileattn/tileattn.hpp>

#include "timing.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using side_by_side::seconds;
using side_by_side::median;

using tileattn::index_t;
constexpr index_t hq = 32, hkv = 8, dim = 128, page = 16;

/// Reads every float of `buffer` on `threads` threads (the flush, and the streaming probe).
double read_all(const std::vector<float>& buffer, int threads) {
  double total = 0;
  const auto n = static_cast<std::ptrdiff_t>(buffer.size());
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
  for (std::ptrdiff_t i = 0; i < n; i += 16) {
    float s = 0;
    for (int j = 0; j < 16; ++j) s += buffer[static_cast<std::size_t>(i + j)];
    total += s;
  }
  return total;
}

/// One decode step's inputs over a cache of T: the cache, its sequences and Q / O.
template <class T>
struct DecodeCase {
  tileattn::KvCache<T> cache;
  std::vector<tileattn::SequenceId> ids;
  std::vector<tileattn::bf16> q, o;

  DecodeCase(index_t batch, index_t context)
      : cache({.num_layers = 1, .num_pages = batch * (context / page + 1), .page_size = page, .heads_kv = hkv,
               .head_dim = dim}),
        q(static_cast<std::size_t>(batch * hq * dim)),
        o(q.size()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (auto& x : q) x = tileattn::bf16(normal(rng));
    constexpr index_t chunk = 1024;
    std::vector<float> rows(static_cast<std::size_t>(chunk * hkv * dim));
    std::vector<T> stored(std::is_same_v<T, tileattn::bf16> ? rows.size() : 0);
    for (index_t b = 0; b < batch; ++b) {
      ids.push_back(cache.create());
      for (index_t t = 0; t < context; t += chunk) {
        const index_t n = std::min(chunk, context - t);
        for (auto& x : rows) x = normal(rng);
        const tileattn::TensorView<const float> f{rows.data(), {1, n, hkv, dim}, {n * hkv * dim, hkv * dim, dim, 1}};
        if constexpr (std::is_same_v<T, tileattn::bf16>) {
          for (std::size_t i = 0; i < rows.size(); ++i) stored[i] = tileattn::bf16(rows[i]);
          const tileattn::TensorView<const T> s{stored.data(), {1, n, hkv, dim}, {n * hkv * dim, hkv * dim, dim, 1}};
          cache.append(ids.back(), s, s);
        } else {
          cache.append(ids.back(), f, f);
        }
      }
    }
  }

  /// One decode step; returns the bytes it read.
  std::uint64_t step(int threads) {
    const auto batch = static_cast<index_t>(ids.size());
    const auto tables = cache.batch(ids);
    tileattn::PagedOptions options;
    options.execution = {tileattn::Backend::openmp, threads};
    tileattn::IoCounts counts;
    options.io_counts = &counts;
    if constexpr (std::is_same_v<T, std::int8_t>) {
      options.k_scale = cache.k_scales(0);
      options.v_scale = cache.v_scales(0);
    }
    const tileattn::TensorView<const tileattn::bf16> qv{q.data(), {batch, 1, hq, dim}, {hq * dim, hq * dim, dim, 1}};
    const tileattn::TensorView<tileattn::bf16> ov{o.data(), {batch, 1, hq, dim}, {hq * dim, hq * dim, dim, 1}};
    tileattn::forward_paged(qv, cache.k_pages(0), cache.v_pages(0), tables.block_table_view(), tables.seqlens(), ov,
                            options);
    return counts.bytes_read;
  }
};

std::string range_ms(const std::vector<double>& v) {
  char s[96];
  std::snprintf(s, sizeof s, "%8.3f ms (%.3f-%.3f)", median(v) * 1e3, *std::min_element(v.begin(), v.end()) * 1e3,
                *std::max_element(v.begin(), v.end()) * 1e3);
  return s;
}

void run_context(index_t batch, index_t context, int threads, int repeats, const std::vector<float>& flush) {
  DecodeCase<tileattn::bf16> bf16_case(batch, context);
  DecodeCase<std::int8_t> int8_case(batch, context);
  DecodeCase<tileattn::q4_0_block> q4_case(batch, context);
  DecodeCase<tileattn::mxfp4_block> mx_case(batch, context);
  const std::vector<std::function<std::uint64_t()>> steps{[&] { return bf16_case.step(threads); },
                                                          [&] { return int8_case.step(threads); },
                                                          [&] { return q4_case.step(threads); },
                                                          [&] { return mx_case.step(threads); }};
  const char* names[] = {"bf16", "int8", "q4_0", "mxfp4"};
  std::vector<std::uint64_t> bytes(steps.size());
  for (std::size_t f = 0; f < steps.size(); ++f) bytes[f] = steps[f]();  // warm-up, and the bytes
  std::vector<std::vector<double>> times(steps.size()), ratios(steps.size());
  std::vector<double> stream;
  volatile double sink = 0;
  const double flush_bytes = static_cast<double>(flush.size() * sizeof(float));
  for (int r = 0; r < repeats; ++r) {
    stream.push_back(flush_bytes / seconds([&] { sink = sink + read_all(flush, threads); }));
    std::vector<double> t(steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const std::size_t f = (i + static_cast<std::size_t>(r)) % steps.size();  // rotate the order
      sink = sink + read_all(flush, threads);                                   // flush the caches
      t[f] = seconds([&] { steps[f](); });
    }
    for (std::size_t f = 0; f < steps.size(); ++f) {
      times[f].push_back(t[f]);
      ratios[f].push_back(t[f] / t[0]);
    }
  }
  const double rate = median(stream);
  std::printf("context %6ld batch %ld threads %2d: streaming read %.2f GB/s (median of %d)\n", static_cast<long>(context),
              static_cast<long>(batch), threads, rate / 1e9, repeats);
  for (std::size_t f = 0; f < steps.size(); ++f) {
    const double step_rate = static_cast<double>(bytes[f]) / median(times[f]);
    std::printf("  %-6s %s  %7.1f MB read  %.2f GB/s = %.2f of streaming  x bf16 %.3f (%.3f-%.3f)\n", names[f],
                range_ms(times[f]).c_str(), static_cast<double>(bytes[f]) / 1e6, step_rate / 1e9, step_rate / rate,
                median(ratios[f]), *std::min_element(ratios[f].begin(), ratios[f].end()),
                *std::max_element(ratios[f].begin(), ratios[f].end()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  const index_t batch = argc > 3 ? std::atol(argv[3]) : 4;
  std::vector<index_t> contexts{4096, 16384, 32768};
  if (argc > 4) {
    contexts.clear();
    std::stringstream list(argv[4]);
    for (std::string item; std::getline(list, item, ',');) contexts.push_back(std::atol(item.c_str()));
  }
  const std::size_t flush_mib = argc > 5 ? static_cast<std::size_t>(std::atol(argv[5])) : 1024;
  std::vector<float> flush(flush_mib * 1024 * 1024 / sizeof(float), 1.0f);
  std::printf("q4_timer: Hq %ld Hkv %ld d %ld, pages of %ld, Q/O bf16, %zu MiB flush; isa %s\n", static_cast<long>(hq),
              static_cast<long>(hkv), static_cast<long>(dim), static_cast<long>(page), flush_mib,
              tileattn::active_isa());
  for (index_t context : contexts) run_context(batch, context, threads, repeats, flush);
}
