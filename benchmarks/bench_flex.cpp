// benchmarks/bench_flex.cpp: flexible attention (flex.hpp) next to the built-in path that
// computes the same thing, in one run, so each ratio comes from one binary and one process.
// Every pair is a family; its two members differ only in the call:
//
//   causal_fp32/...   B 1, H 8, N 4096, d 128: forward() with options.causal, against
//   causal_bf16/...   forward_flex() with flex::causal and its block mask (bf16: the same
//                     inputs rounded once). Target: flex within 10% of built-in time.
//   document/...      8 documents of 1024 tokens packed into 8192, H 8, d 128, non-causal:
//                     forward_varlen() over cu_seqlens, against forward_flex() over one
//                     sequence of 8192 with flex::document on a doc-id array and its block
//                     mask. Target: flex GFLOP/s >= 0.8x varlen's.
//   block_sparse/...  N 8192, H 8, d 128: forward_flex() with flex::block_sparse on a random
//                     layout of 128 x 128 blocks at 10% density (every diagonal block, the
//                     rest drawn from a fixed seed) and its block mask, against the dense
//                     forward (no mask). Target: flex time <= 15% of dense.
//   causal_bwd/...    B 1, H 8, N 4096, d 128, fp32: backward() with options.causal against
//                     backward_flex() with flex::causal and its block mask, each on the O and
//                     LSE of its own untimed forward. No target of its own (1.10x shown).
//   tree_verify/...   a speculative verify step: 64 draft tokens at the end of a 32k-token
//                     paged cache (fp32, Hq 32, Hkv 8, d 128, pages of 16): forward_paged()
//                     with options.causal (a chain of drafts), against forward_paged_flex()
//                     with draft_tree_mask() on a 64-node tree (fixed seed). Target: tree
//                     time <= 1.2x causal (issue #32).
//
// Each family has three rows: <family>/<baseline> and <family>/flex time one member each;
// <family>/paired runs both in every iteration, alternating which goes first, and reports
// their ratio for that repetition. On a shared machine the paired ratio is the one to quote:
// both members see the same load, where the separate rows may run minutes apart.
//
// Block masks are built once per benchmark, outside the timed loop (create_block_mask's
// default 128 x 128 blocks). Iteration counts are fixed (one invocation per repetition, so
// the summary sees every repetition); each row makes one untimed warm-up call first.
//
// Counters:
//   GFLOP/s   4 d FLOPs per visited (query, key) element, i.e. per element the mask shows
//             (causal: N (N + 1) / 2 per head; document: 8 x 1024^2 per head; block-sparse:
//             128^2 per non-empty block; dense: N^2), per second of real time; the backward
//             is credited 2.5 times the forward's (FlashAttention's count)
//   of_peak   GFLOP/s over the register-resident FMA loop (fp32) or vdpbf16ps loop (bf16)
//             measured in this process on the same threads (ceilings.hpp)
//   density, partial   the block mask's fraction of non-empty blocks, its partial blocks
//   ratio     paired rows: flex time / baseline time over the repetition's iterations
//             (document: flex GFLOP/s / varlen GFLOP/s, the same FLOPs credited to both)
//
// After the table (console output only) a summary prints, per family, each member's median
// time over the repetitions with its min..max spread, the ratio of those medians, the
// median and range of the paired ratios, and whether the paired median meets the target:
//
//   OMP_NUM_THREADS=2 bench_flex --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   bench_flex --benchmark_filter=paired          # the paired rows only
//   bench_flex --benchmark_filter=document        # one family
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ceilings.hpp"
#include "tileattn/flex.hpp"
#include "tileattn/tileattn.hpp"

namespace {

using tileattn::index_t;
namespace flex = tileattn::flex;

// ---------------------------------------------------------------------------------------
// Ceilings and the per-repetition record the summary reads

struct Ceilings {
  int threads = 0;
  double fma_gflops = 0, bf16_dot_gflops = 0;
};
Ceilings& ceilings() {
  static Ceilings c;
  return c;
}
template <class T>
double peak_gflops() {
  return std::is_same_v<T, float> ? ceilings().fma_gflops : ceilings().bf16_dot_gflops;
}

/// Per repetition, by benchmark name: seconds per iteration (members) or the ratio (paired).
std::map<std::string, std::vector<double>>& record() {
  static std::map<std::string, std::vector<double>> r;
  return r;
}

double seconds_since(tileattn::bench::Clock::time_point start) {
  return std::chrono::duration<double>(tileattn::bench::Clock::now() - start).count();
}

// ---------------------------------------------------------------------------------------
// Problems

std::vector<float> random_normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

/// One [1, N, H, d] self-attention problem in storage type T (N(0, 1) inputs from fixed
/// seeds, rounded to T once), with an output and LSE per implementation (baseline, flex)
/// and, when asked, dO and gradient buffers.
template <class T>
struct Problem {
  index_t n, heads, d;
  std::vector<T> q, k, v, o, o_flex, dout, dq, dk, dv;
  std::vector<float> lse, lse_flex;

  Problem(index_t n_, index_t heads_, index_t d_, bool gradients) : n(n_), heads(heads_), d(d_) {
    const auto size = static_cast<std::size_t>(n * heads * d);
    q = round(random_normal(size, 1));
    k = round(random_normal(size, 2));
    v = round(random_normal(size, 3));
    o.assign(size, T{});
    o_flex.assign(size, T{});
    lse.assign(static_cast<std::size_t>(heads * n), 0.0f);
    lse_flex = lse;
    if (gradients) {
      dout = round(random_normal(size, 4));
      dq.assign(size, T{});
      dk.assign(size, T{});
      dv.assign(size, T{});
    }
  }
  static std::vector<T> round(const std::vector<float>& x) {
    std::vector<T> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = tileattn::from_float<T>(x[i]);
    return r;
  }
  tileattn::TensorView<const T> in(const std::vector<T>& x) const {
    return tileattn::make_bshd<const T>(x.data(), 1, n, heads, d);
  }
  tileattn::TensorView<T> out(std::vector<T>& x) { return tileattn::make_bshd(x.data(), 1, n, heads, d); }
  tileattn::LseView lse_view(std::vector<float>& x) { return tileattn::make_lse(x.data(), 1, heads, n); }
  tileattn::PackedView<const T> packed(const std::vector<T>& x) const { return tileattn::make_thd(x.data(), n, heads, d); }
};

/// Benchmarks are registered so that a family's rows run one after the other: this
/// one-entry cache per storage type builds each problem once (and frees the previous one).
template <class T>
Problem<T>& problem_for(index_t n, index_t heads, index_t d, bool gradients) {
  static std::unique_ptr<Problem<T>> cached;
  if (!cached || cached->n != n || cached->heads != heads || cached->d != d || cached->dout.empty() != !gradients) {
    cached.reset();
    cached = std::make_unique<Problem<T>>(n, heads, d, gradients);
  }
  return *cached;
}

double causal_elements(index_t n) { return static_cast<double>(n) * static_cast<double>(n + 1) / 2; }

std::string plan_label(const tileattn::TilePlan& plan) {
  return "Br=" + std::to_string(plan.query_tile_rows) + " Bc=" + std::to_string(plan.key_tile_rows);
}

// ---------------------------------------------------------------------------------------
// The families: each builds its two members (the call, its FLOPs, its counters)

/// One side of a family: a call and what the row reports about it.
struct Member {
  std::function<void()> run;
  double flops = 0;  // visited-element FLOPs of one call
  double peak = 0;   // the ceiling it is a fraction of (GFLOP/s)
  std::map<std::string, double> counters;
  std::string label;
};
struct Pair {
  Member baseline, flex;
};

/// The flex member of a block mask: its call, and the mask's density and partial blocks.
template <class Mask>
Member flex_member(std::shared_ptr<const tileattn::BlockMask<Mask>> blocks, std::function<void()> run) {
  Member m;
  m.run = std::move(run);
  m.counters["density"] = blocks->density();
  m.counters["partial"] = static_cast<double>(blocks->count(tileattn::BlockKind::partial));
  return m;
}

constexpr index_t causal_n = 4096, causal_heads = 8, causal_d = 128;

template <class T>
Pair causal_pair() {
  Problem<T>& p = problem_for<T>(causal_n, causal_heads, causal_d, false);
  const double flops = 4.0 * causal_d * causal_heads * causal_elements(causal_n);
  tileattn::ForwardOptions opts;
  opts.causal = true;
  Pair pair;
  pair.baseline.run = [&p, opts] {
    tileattn::forward(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o), p.lse_view(p.lse), opts);
    benchmark::DoNotOptimize(p.o.data());
  };
  pair.baseline.label = plan_label(tileattn::plan_forward(p.in(p.q), p.in(p.k), p.in(p.v), opts).tiles());
  const auto blocks = std::make_shared<const tileattn::BlockMask<flex::causal>>(
      tileattn::create_block_mask(flex::causal{}, 1, 1, causal_n, causal_n));
  pair.flex = flex_member(blocks, [&p, blocks] {
    tileattn::forward_flex(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o_flex), p.lse_view(p.lse_flex),
                           flex::no_score_mod{}, *blocks);
    benchmark::DoNotOptimize(p.o_flex.data());
  });
  pair.flex.label = plan_label(tileattn::plan_forward(p.in(p.q), p.in(p.k), p.in(p.v), {}).tiles());
  pair.baseline.flops = pair.flex.flops = flops;
  pair.baseline.peak = pair.flex.peak = peak_gflops<T>();
  return pair;
}

constexpr index_t doc_count = 8, doc_len = 1024, doc_heads = 8, doc_d = 128;
constexpr index_t doc_total = doc_count * doc_len;

Pair document_pair() {
  Problem<float>& p = problem_for<float>(doc_total, doc_heads, doc_d, false);
  auto cu = std::make_shared<std::vector<std::int32_t>>();
  for (index_t i = 0; i <= doc_count; ++i) cu->push_back(static_cast<std::int32_t>(i * doc_len));
  auto ids = std::make_shared<std::vector<std::int32_t>>(static_cast<std::size_t>(doc_total));
  for (index_t i = 0; i < doc_total; ++i) (*ids)[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / doc_len);
  Pair pair;
  pair.baseline.run = [&p, cu] {
    const tileattn::VarlenSequences seqs{*cu, *cu, doc_len, doc_len};
    tileattn::forward_varlen(p.packed(p.q), p.packed(p.k), p.packed(p.v),
                             tileattn::make_thd(p.o.data(), doc_total, doc_heads, doc_d),
                             tileattn::make_packed_lse(p.lse.data(), doc_heads, doc_total), seqs, {});
    benchmark::DoNotOptimize(p.o.data());
  };
  const auto blocks = std::make_shared<const tileattn::BlockMask<flex::document>>(
      tileattn::create_block_mask(flex::document{*ids}, 1, 1, doc_total, doc_total));
  pair.flex = flex_member(blocks, [&p, blocks, ids] {  // ids: the mask's array lives as long
    tileattn::forward_flex(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o_flex), p.lse_view(p.lse_flex),
                           flex::no_score_mod{}, *blocks);
    benchmark::DoNotOptimize(p.o_flex.data());
  });
  pair.flex.label = plan_label(tileattn::plan_forward(p.in(p.q), p.in(p.k), p.in(p.v), {}).tiles());
  pair.baseline.flops = pair.flex.flops =
      4.0 * doc_d * doc_heads * static_cast<double>(doc_count) * static_cast<double>(doc_len * doc_len);
  pair.baseline.peak = pair.flex.peak = peak_gflops<float>();
  return pair;
}

constexpr index_t sparse_n = 8192, sparse_heads = 8, sparse_d = 128, sparse_block = 128;
constexpr index_t sparse_blocks = sparse_n / sparse_block;

/// The layout: every diagonal block, then distinct off-diagonal blocks drawn from a fixed
/// seed until 10% of all blocks are set (410 of 4096: density 0.1001).
const std::vector<std::uint8_t>& sparse_layout() {
  static const std::vector<std::uint8_t> layout = [] {
    std::vector<std::uint8_t> l(static_cast<std::size_t>(sparse_blocks * sparse_blocks), 0);
    for (index_t b = 0; b < sparse_blocks; ++b) l[static_cast<std::size_t>(b * sparse_blocks + b)] = 1;
    const auto target = static_cast<index_t>(0.10 * static_cast<double>(l.size()) + 0.5);
    std::mt19937 rng(2026);
    std::uniform_int_distribution<index_t> pick(0, static_cast<index_t>(l.size()) - 1);
    for (index_t set = sparse_blocks; set < target;) {
      auto& e = l[static_cast<std::size_t>(pick(rng))];
      if (!e) e = 1, ++set;
    }
    return l;
  }();
  return layout;
}

Pair block_sparse_pair() {
  Problem<float>& p = problem_for<float>(sparse_n, sparse_heads, sparse_d, false);
  Pair pair;
  pair.baseline.run = [&p] {
    tileattn::forward(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o), p.lse_view(p.lse), {});
    benchmark::DoNotOptimize(p.o.data());
  };
  pair.baseline.flops = 4.0 * sparse_d * sparse_heads * static_cast<double>(sparse_n) * static_cast<double>(sparse_n);
  pair.baseline.label = plan_label(tileattn::plan_forward(p.in(p.q), p.in(p.k), p.in(p.v), {}).tiles());
  const flex::block_sparse mask{sparse_layout(), sparse_blocks, sparse_block};
  const auto blocks = std::make_shared<const tileattn::BlockMask<flex::block_sparse>>(
      tileattn::create_block_mask(mask, 1, 1, sparse_n, sparse_n, {sparse_block, sparse_block}));
  pair.flex = flex_member(blocks, [&p, blocks] {
    tileattn::forward_flex(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o_flex), p.lse_view(p.lse_flex),
                           flex::no_score_mod{}, *blocks);
    benchmark::DoNotOptimize(p.o_flex.data());
  });
  const auto& l = sparse_layout();
  pair.flex.flops = 4.0 * sparse_d * sparse_heads * static_cast<double>(std::count(l.begin(), l.end(), 1)) *
                    sparse_block * sparse_block;
  pair.flex.label = pair.baseline.label;
  pair.baseline.peak = pair.flex.peak = peak_gflops<float>();
  return pair;
}

Pair causal_bwd_pair() {
  Problem<float>& p = problem_for<float>(causal_n, causal_heads, causal_d, true);
  tileattn::BackwardOptions opts;
  opts.causal = true;
  tileattn::forward(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o), p.lse_view(p.lse), opts);
  Pair pair;
  pair.baseline.run = [&p, opts] {
    tileattn::backward(p.in(p.q), p.in(p.k), p.in(p.v), p.in(p.o), p.lse_view(p.lse), p.in(p.dout), p.out(p.dq),
                       p.out(p.dk), p.out(p.dv), opts);
    benchmark::DoNotOptimize(p.dq.data());
  };
  const auto blocks = std::make_shared<const tileattn::BlockMask<flex::causal>>(
      tileattn::create_block_mask(flex::causal{}, 1, 1, causal_n, causal_n));
  tileattn::forward_flex(p.in(p.q), p.in(p.k), p.in(p.v), p.out(p.o_flex), p.lse_view(p.lse_flex),
                         flex::no_score_mod{}, *blocks);
  pair.flex = flex_member(blocks, [&p, blocks] {
    tileattn::backward_flex(p.in(p.q), p.in(p.k), p.in(p.v), p.in(p.o_flex), p.lse_view(p.lse_flex), p.in(p.dout),
                            p.out(p.dq), p.out(p.dk), p.out(p.dv), flex::no_score_mod{}, *blocks);
    benchmark::DoNotOptimize(p.dq.data());
  });
  pair.baseline.flops = pair.flex.flops = 2.5 * 4.0 * causal_d * causal_heads * causal_elements(causal_n);
  pair.baseline.peak = pair.flex.peak = peak_gflops<float>();
  return pair;
}

constexpr index_t verify_keys = 32768, verify_tokens = 64, verify_heads = 32, verify_heads_kv = 8, verify_d = 128;
constexpr index_t verify_page = 16;

/// A paged cache of one sequence of verify_keys keys (its last verify_tokens are the drafts)
/// and the drafts' queries, fp32, and a draft tree of verify_tokens nodes (fixed seed: each
/// draft extends one of the 8 before it, or the accepted tokens, one in eight).
struct VerifyProblem {
  std::vector<float> q, k_pool, v_pool, o, o_flex, lse, lse_flex;
  std::vector<std::int32_t> table, seqlens{static_cast<std::int32_t>(verify_keys)}, parents;
  VerifyProblem() {
    q = random_normal(static_cast<std::size_t>(verify_tokens * verify_heads * verify_d), 5);
    k_pool = random_normal(static_cast<std::size_t>(verify_keys * verify_heads_kv * verify_d), 6);
    v_pool = random_normal(k_pool.size(), 7);
    o.assign(q.size(), 0.0f);
    o_flex = o;
    lse.assign(static_cast<std::size_t>(verify_heads * verify_tokens), 0.0f);
    lse_flex = lse;
    for (index_t p = 0; p < verify_keys / verify_page; ++p) table.push_back(static_cast<std::int32_t>(p));
    std::mt19937 rng(64);
    for (index_t t = 0; t < verify_tokens; ++t) {
      const auto back = static_cast<std::int32_t>(1 + rng() % 8);
      parents.push_back(t == 0 || rng() % 8 == 0 ? -1 : std::max<std::int32_t>(-1, static_cast<std::int32_t>(t) - back));
    }
  }
  tileattn::TensorView<const float> pool(const std::vector<float>& x) const {
    return tileattn::make_bshd<const float>(x.data(), verify_keys / verify_page, verify_page, verify_heads_kv, verify_d);
  }
  tileattn::TensorView<const float> queries() const {
    return tileattn::make_bshd<const float>(q.data(), 1, verify_tokens, verify_heads, verify_d);
  }
  tileattn::TensorView<float> out(std::vector<float>& x) const {
    return tileattn::make_bshd(x.data(), 1, verify_tokens, verify_heads, verify_d);
  }
  tileattn::BlockTableView block_table() const {
    return tileattn::make_block_table(table.data(), 1, verify_keys / verify_page);
  }
};

Pair tree_verify_pair() {
  static VerifyProblem p;  // 256 MiB of pages: built once
  Pair pair;
  tileattn::PagedOptions causal;
  causal.causal = true;
  pair.baseline.run = [causal] {
    tileattn::forward_paged(p.queries(), p.pool(p.k_pool), p.pool(p.v_pool), p.block_table(), p.seqlens, p.out(p.o),
                            tileattn::make_lse(p.lse.data(), 1, verify_heads, verify_tokens), causal);
    benchmark::DoNotOptimize(p.o.data());
  };
  const auto blocks = std::make_shared<const tileattn::BlockMask<flex::draft_tree>>(
      tileattn::draft_tree_mask(p.parents, verify_tokens, p.seqlens));
  pair.flex = flex_member(blocks, [blocks] {
    tileattn::forward_paged_flex(p.queries(), p.pool(p.k_pool), p.pool(p.v_pool), p.block_table(), p.seqlens,
                                 p.out(p.o_flex), tileattn::make_lse(p.lse_flex.data(), 1, verify_heads, verify_tokens),
                                 flex::no_score_mod{}, *blocks);
    benchmark::DoNotOptimize(p.o_flex.data());
  });
  // Both credited the same work: every (draft, accepted key) pair and the draft block.
  pair.baseline.flops = pair.flex.flops = 4.0 * verify_d * verify_heads * verify_tokens * static_cast<double>(verify_keys);
  pair.baseline.peak = pair.flex.peak = peak_gflops<float>();
  return pair;
}

struct Family {
  const char* name;
  const char* baseline;  // the rows: name/baseline, name/flex, name/paired
  Pair (*make)();
  bool rate;      // the ratio is flex GFLOP/s / baseline GFLOP/s (else flex time / baseline time)
  double target;  // time: ratio <= target; rate: ratio >= target
  const char* text;
  int baseline_iterations, flex_iterations, paired_iterations;  // about a second per repetition
};

const std::vector<Family>& families() {
  static const std::vector<Family> f{
      {"causal_fp32", "builtin", &causal_pair<float>, false, 1.10, "flex time <= 1.10x built-in", 3, 3, 2},
      {"causal_bf16", "builtin", &causal_pair<tileattn::bf16>, false, 1.10, "flex time <= 1.10x built-in", 3, 3, 2},
      {"document", "varlen", &document_pair, true, 0.80, "flex GFLOP/s >= 0.8x varlen", 3, 3, 2},
      {"block_sparse", "dense", &block_sparse_pair, false, 0.15, "flex time <= 0.15x dense", 1, 2, 1},
      {"causal_bwd", "builtin", &causal_bwd_pair, false, 1.10, "none (1.10x as the forward)", 1, 1, 1},
      {"tree_verify", "causal", &tree_verify_pair, false, 1.20, "tree time <= 1.20x causal verify", 3, 3, 2},
  };
  return f;
}

// ---------------------------------------------------------------------------------------
// The rows

void set_counters(benchmark::State& state, const Member& m) {
  using benchmark::Counter;
  state.counters["GFLOP/s"] = Counter(m.flops * 1e-9, Counter::kIsIterationInvariantRate);
  if (m.peak > 0) state.counters["of_peak"] = Counter(m.flops * 1e-9 / m.peak, Counter::kIsIterationInvariantRate);
  for (const auto& [name, value] : m.counters) state.counters[name] = value;
  if (!m.label.empty()) state.SetLabel(m.label);
}

/// One member timed alone.
void bm_member(benchmark::State& state, const Family* family, bool flex_side, const std::string& name) {
  const Pair pair = family->make();
  const Member& m = flex_side ? pair.flex : pair.baseline;
  m.run();  // warm-up: threads started, scratch arenas and output pages touched
  const auto start = tileattn::bench::Clock::now();
  for (auto _ : state) {
    m.run();
    benchmark::ClobberMemory();
  }
  record()[name].push_back(seconds_since(start) / static_cast<double>(state.iterations()));
  set_counters(state, m);
}

/// Both members in every iteration, alternating which goes first; the ratio of their times.
void bm_paired(benchmark::State& state, const Family* family, const std::string& name) {
  static std::map<std::string, int> calls;  // alternates the first member across repetitions too
  const Pair pair = family->make();
  pair.baseline.run();
  pair.flex.run();
  double base = 0, flex_seconds = 0;
  int turn = calls[name]++;
  for (auto _ : state) {
    for (int side = 0; side < 2; ++side) {
      const bool flex_now = (side + turn) % 2 == 1;
      const auto start = tileattn::bench::Clock::now();
      (flex_now ? pair.flex : pair.baseline).run();
      (flex_now ? flex_seconds : base) += seconds_since(start);
    }
    ++turn;
    benchmark::ClobberMemory();
  }
  const double ratio = family->rate ? (base / pair.baseline.flops) / (flex_seconds / pair.flex.flops)
                                    : flex_seconds / base;
  record()[name].push_back(ratio);
  const auto n = static_cast<double>(state.iterations());
  state.counters["ratio"] = ratio;
  state.counters[std::string(family->baseline) + "_ms"] = base / n * 1e3;
  state.counters["flex_ms"] = flex_seconds / n * 1e3;
}

// ---------------------------------------------------------------------------------------
// The summary

struct Spread {
  double median = 0, min = 0, max = 0;
  std::size_t n = 0;
};
Spread spread_of(const std::string& name) {
  const auto it = record().find(name);
  if (it == record().end() || it->second.empty()) return {};
  std::vector<double> x = it->second;
  std::sort(x.begin(), x.end());
  const std::size_t m = x.size() / 2;
  return {x.size() % 2 ? x[m] : (x[m - 1] + x[m]) / 2, x.front(), x.back(), x.size()};
}

/// The FMA loop's GFLOP/s measured again now (ceilings.hpp caches its first measurement):
/// when it differs much from the start's, other processes shared the cores during the run.
double fma_gflops_now(int threads) {
  constexpr long iterations = 20'000'000;
  volatile float sink = 0;
  return tileattn::bench::detail::best_of(3, [&] {
    const double seconds =
        tileattn::bench::run_on_threads(threads, [&](int) { sink = tileattn::bench::detail::fma_chains(iterations); });
    return 2.0 * 16 * 16 * iterations * threads / seconds * 1e-9;
  });
}

void print_summary() {
  const Ceilings& c = ceilings();
  std::printf("\nCeilings, %d threads: FMA loop %.1f GFLOP/s (%.1f measured again at the end), vdpbf16ps loop ",
              c.threads, c.fma_gflops, fma_gflops_now(c.threads));
  if (c.bf16_dot_gflops > 0) std::printf("%.1f GFLOP/s\n", c.bf16_dot_gflops);
  else std::printf("n/a\n");
  std::printf("%-12s %-8s %-26s %-26s %-8s %-22s %-29s %s\n", "family", "baseline", "baseline ms: median [range]",
              "flex ms: median [range]", "ratio", "paired: median [range]", "target", "");
  for (const Family& f : families()) {
    const std::string prefix = std::string(f.name) + "/";
    const Spread b = spread_of(prefix + f.baseline), x = spread_of(prefix + "flex"), p = spread_of(prefix + "paired");
    if (b.n == 0 && x.n == 0 && p.n == 0) continue;
    std::printf("%-12s %-8s ", f.name, f.baseline);
    const auto times = [](const Spread& s) {
      if (s.n) std::printf("%7.1f [%7.1f..%7.1f]   ", s.median * 1e3, s.min * 1e3, s.max * 1e3);
      else std::printf("%-26s ", "-");
    };
    times(b);
    times(x);
    const double ratio = b.n && x.n ? (f.rate ? b.median / x.median : x.median / b.median) : 0.0;
    if (ratio > 0) std::printf("%-8.3f ", ratio);
    else std::printf("%-8s ", "-");
    if (p.n) std::printf("%.3f [%.3f..%.3f]    ", p.median, p.min, p.max);
    else std::printf("%-22s ", "-");
    const double judged = p.n ? p.median : ratio;  // the paired ratio when it ran
    const bool met = f.rate ? judged >= f.target : judged <= f.target;
    std::printf("%-29s %s\n", f.text, judged > 0 ? (met ? "met" : "MISSED") : "");
  }
  std::printf("ratio: of the members' medians; paired: of both members timed in the same iterations, per "
              "repetition (judged against the target). Time families: flex / baseline time; document: flex "
              "GFLOP/s / varlen GFLOP/s.\n");
}

bool console_output(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--benchmark_format=", 19) == 0 && std::strcmp(argv[i] + 19, "console") != 0)
      return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool console = console_output(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Ceilings& c = ceilings();
  c.threads = tileattn::worker_count(tileattn::Execution{});
  c.fma_gflops = tileattn::bench::fma_peak_gflops(c.threads);
  c.bf16_dot_gflops = tileattn::bench::bf16_dot_peak_gflops(c.threads);
  benchmark::AddCustomContext("threads", std::to_string(c.threads));
  benchmark::AddCustomContext("fma_peak_gflops", std::to_string(c.fma_gflops));
  benchmark::AddCustomContext("bf16_dot_peak_gflops", std::to_string(c.bf16_dot_gflops));

  // A family's rows run one after the other, so its problem is built once.
  for (const Family& f : families()) {
    const std::string base = std::string(f.name) + "/" + f.baseline, flex_name = std::string(f.name) + "/flex",
                      paired = std::string(f.name) + "/paired";
    const auto add = [](const std::string& name, int iterations, auto fn) {
      benchmark::RegisterBenchmark(name.c_str(), fn)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(
          iterations);
    };
    const Family* fam = &f;
    add(base, f.baseline_iterations, [fam, base](benchmark::State& s) { bm_member(s, fam, false, base); });
    add(flex_name, f.flex_iterations, [fam, flex_name](benchmark::State& s) { bm_member(s, fam, true, flex_name); });
    add(paired, f.paired_iterations, [fam, paired](benchmark::State& s) { bm_paired(s, fam, paired); });
  }
  benchmark::RunSpecifiedBenchmarks();
  if (console) print_summary();
  benchmark::Shutdown();
  return 0;
}
