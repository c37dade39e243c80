// benchmarks/side_by_side/serving_timer.cpp: issue #32's serving options against the calls they
// replace, paired in one process (each repetition runs both, alternating which goes first):
// the median and min-max of R repetitions of each, and the median of the per-repetition ratios.
// No Google Benchmark, so it builds on the lent Xeon with g++ alone:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude benchmarks/side_by_side/serving_timer.cpp
//   ./a.out WORKLOAD THREADS REPEATS
//
//   tree_verify  a speculative verify step, 64 drafts at the end of a 32k-token paged cache (fp32,
//                Hq 32, Hkv 8, d 128, pages of 16): forward_paged_flex with draft_tree_mask on a
//                64-node tree against forward_paged with causal (a chain). Target: <= 1.2x.
//   chunk        prefill N 8192 (fp32, Hq 8, Hkv 2, d 128) with causal and attention_chunk 2048
//                (Llama 4's local layers) against causal alone: the chunked call visits about a
//                quarter of the scores (1/4 + 1/8192), so its time should be about a quarter.
//   invariant    a decode step of 8 sequences of 1k to 32k keys (bf16 paged cache, Hq 32, Hkv 8,
//                d 128) with batch_invariant against the default split-KV: the mode's cost.
#include <tileattn/tileattn.hpp>

#include "timing.hpp"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using side_by_side::seconds;
using side_by_side::median;

using tileattn::index_t;
constexpr index_t hq = 32, hkv = 8, dim = 128, page = 16;

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<T> x(n);
  for (T& e : x) e = tileattn::from_float<T>(normal(rng));
  return x;
}

/// R paired repetitions of `base` and `option` after a warm-up of each; prints the summary.
void compare(const char* workload, const char* base_name, const std::function<void()>& base,
             const char* option_name, const std::function<void()>& option, int threads, int repeats) {
  base();
  option();
  std::vector<double> tb, to, ratio;
  for (int r = 0; r < repeats; ++r) {
    const bool option_first = r % 2 == 1;
    double a = 0, b = 0;
    if (option_first) b = seconds(option), a = seconds(base);
    else a = seconds(base), b = seconds(option);
    tb.push_back(a), to.push_back(b), ratio.push_back(b / a);
  }
  const auto ms = [](const std::vector<double>& v) {
    return std::to_string(median(v) * 1e3).substr(0, 7) + " ms (" + std::to_string(*std::min_element(v.begin(), v.end()) * 1e3).substr(0, 7) +
           "-" + std::to_string(*std::max_element(v.begin(), v.end()) * 1e3).substr(0, 7) + ")";
  };
  std::printf("%-12s threads %2d  %s %s  %s %s  ratio median %.3f (%.3f-%.3f) of %d\n", workload, threads, base_name,
              ms(tb).c_str(), option_name, ms(to).c_str(), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()), repeats);
}

/// One paged cache in T of sequences with the given lengths (pages in order), and its queries.
template <class T>
struct PagedProblem {
  std::vector<index_t> lens;
  index_t q_len, pages = 0;
  std::vector<T> q, k, v, o;
  std::vector<float> lse;
  std::vector<std::int32_t> table, seqlens;
  index_t max_pages = 0;
  PagedProblem(std::vector<index_t> lengths, index_t queries) : lens(std::move(lengths)), q_len(queries) {
    for (index_t n : lens) max_pages = std::max(max_pages, (n + page - 1) / page);
    for (index_t n : lens) {
      for (index_t p = 0; p < max_pages; ++p) table.push_back(static_cast<std::int32_t>(p < (n + page - 1) / page ? pages + p : 0));
      pages += (n + page - 1) / page;
      seqlens.push_back(static_cast<std::int32_t>(n));
    }
    const auto batch = static_cast<index_t>(lens.size());
    q = random_values<T>(static_cast<std::size_t>(batch * q_len * hq * dim), 1);
    k = random_values<T>(static_cast<std::size_t>(pages * page * hkv * dim), 2);
    v = random_values<T>(k.size(), 3);
    o.assign(q.size(), T{});
    lse.assign(static_cast<std::size_t>(batch * hq * q_len), 0.0f);
  }
  index_t batch() const { return static_cast<index_t>(lens.size()); }
  auto queries() const { return tileattn::make_bshd<const T>(q.data(), batch(), q_len, hq, dim); }
  auto pool(const std::vector<T>& x) const { return tileattn::make_bshd<const T>(x.data(), pages, page, hkv, dim); }
  auto out() { return tileattn::make_bshd(o.data(), batch(), q_len, hq, dim); }
  auto lse_view() { return tileattn::make_lse(lse.data(), batch(), hq, q_len); }
  auto block_table() const { return tileattn::make_block_table(table.data(), batch(), max_pages); }
  void run(const tileattn::PagedOptions& options) {
    tileattn::forward_paged(queries(), pool(k), pool(v), block_table(), seqlens, out(), lse_view(), options);
  }
};

void tree_verify(int threads, int repeats) {
  constexpr index_t drafts = 64;
  PagedProblem<float> p({32768}, drafts);
  std::vector<std::int32_t> parents;
  std::mt19937 rng(64);
  for (index_t t = 0; t < drafts; ++t) {
    const auto back = static_cast<std::int32_t>(1 + rng() % 8);
    parents.push_back(t == 0 || rng() % 8 == 0 ? -1 : std::max<std::int32_t>(-1, static_cast<std::int32_t>(t) - back));
  }
  const auto mask = tileattn::draft_tree_mask(parents, drafts, p.seqlens);
  tileattn::PagedOptions causal;
  causal.causal = true;
  causal.execution.num_threads = threads;
  tileattn::PagedOptions plain;
  plain.execution.num_threads = threads;
  compare("tree_verify", "causal", [&] { p.run(causal); }, "tree",
          [&] {
            tileattn::forward_paged_flex(p.queries(), p.pool(p.k), p.pool(p.v), p.block_table(), p.seqlens, p.out(),
                                         p.lse_view(), tileattn::flex::no_score_mod{}, mask, plain);
          },
          threads, repeats);
}

void chunk(int threads, int repeats) {
  constexpr index_t n = 8192, heads = 8, heads_kv = 2;
  const auto q = random_values<float>(static_cast<std::size_t>(n * heads * dim), 1);
  const auto k = random_values<float>(static_cast<std::size_t>(n * heads_kv * dim), 2);
  const auto v = random_values<float>(k.size(), 3);
  std::vector<float> o(q.size());
  tileattn::ForwardOptions causal;
  causal.causal = true;
  causal.execution.num_threads = threads;
  tileattn::ForwardOptions chunked = causal;
  chunked.attention_chunk = 2048;
  const auto run = [&](const tileattn::ForwardOptions& opts) {
    tileattn::forward(tileattn::make_bshd<const float>(q.data(), 1, n, heads, dim),
                      tileattn::make_bshd<const float>(k.data(), 1, n, heads_kv, dim),
                      tileattn::make_bshd<const float>(v.data(), 1, n, heads_kv, dim), tileattn::make_bshd(o.data(), 1, n, heads, dim),
                      opts);
  };
  compare("chunk", "causal", [&] { run(causal); }, "chunk2048", [&] { run(chunked); }, threads, repeats);
}

void invariant(int threads, int repeats) {
  PagedProblem<tileattn::bf16> p({1024, 32768, 4096, 2048, 16384, 1000, 8192, 3000}, 1);
  tileattn::PagedOptions plain;
  plain.execution.num_threads = threads;
  tileattn::PagedOptions fixed = plain;
  fixed.batch_invariant = true;
  compare("invariant", "default", [&] { p.run(plain); }, "batch_invariant", [&] { p.run(fixed); }, threads, repeats);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s tree_verify|chunk|invariant THREADS REPEATS\n", argv[0]);
    return 2;
  }
  const std::string w = argv[1];
  const int threads = std::atoi(argv[2]), repeats = std::atoi(argv[3]);
  if (w == "tree_verify") tree_verify(threads, repeats);
  else if (w == "chunk") chunk(threads, repeats);
  else if (w == "invariant") invariant(threads, repeats);
  else return 2;
  return 0;
}
