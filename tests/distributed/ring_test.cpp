// distributed/ring.hpp under mpirun -np 1, 2, 3, 4 (tests/distributed/CMakeLists.txt): the
// ring forward and backward against the single-process kernels (fp32 rounding) and the
// double reference, for causal and not, both shardings, windows, ALiBi, softcap, sinks,
// GQA and sequence lengths that do not divide (down to ranks with no rows); bf16 under
// FlashAttention's rule; the same bits on every run and thread count; one rank is the
// local kernel; collective errors that write nothing; NaN reaching the rows that see it.
// ctest runs it with the transfers progressed between kernels and on the progress thread.
// Every rank builds the same full problem from one seed and checks its own shard.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/backward_rule.hpp"
#include "support/backward_support.hpp"
#include "support/naive_same_precision.hpp"
#include "support/shard_rows.hpp"
#include "tileattn/distributed/ring.hpp"

namespace tileattn::test {
namespace {

using ring::ShardLayout;
using ring::Sharding;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// Rank 0's x on every rank. The double references are computed on rank 0 alone and
/// broadcast: when every rank computed them, the N 1000 cases took most of the sanitizer
/// runs' 10 minutes over the rank counts (4 ranks on 2 cores computing the same thing).
template <class E>
void broadcast(std::vector<E>& x) {
  unsigned long long n = x.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  x.resize(static_cast<std::size_t>(n));
  MPI_Bcast(x.data(), static_cast<int>(n * sizeof(E)), MPI_BYTE, 0, MPI_COMM_WORLD);
}
template <class Real>
void broadcast(reference::BackwardGrads<Real>& g) {
  for (auto* x : {&g.dq, &g.dk, &g.dv, &g.dsinks, &g.dbias}) broadcast(*x);
}

struct Config {
  const char* name;
  ProblemShape shape;
  Sharding sharding;
  void (*set)(ForwardOptions&);
};

const float slopes[4] = {0.5f, 0.25f, 0.0625f, 0.015625f};
const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};

std::vector<Config> configs() {
  return {
      {"causal, zig-zag, GQA 4/2, d 40/24", {2, 301, 301, 4, 2, 40, 24}, Sharding::zigzag, [](ForwardOptions& o) { o.causal = true; }},
      {"causal, contiguous", {1, 127, 127, 2, 2, 32, 32}, Sharding::contiguous, [](ForwardOptions& o) { o.causal = true; }},
      {"not causal, N 17", {1, 17, 17, 3, 3, 16, 16}, Sharding::zigzag, [](ForwardOptions&) {}},
      {"not causal, contiguous, MQA", {1, 200, 200, 4, 1, 32, 32}, Sharding::contiguous, [](ForwardOptions&) {}},
      {"window 40 / 7, GQA 4/1", {2, 257, 257, 4, 1, 32, 32}, Sharding::zigzag,
       [](ForwardOptions& o) { o.window_left = 40, o.window_right = 7; }},
      {"causal + ALiBi + softcap", {1, 200, 200, 4, 4, 24, 24}, Sharding::zigzag,
       [](ForwardOptions& o) { o.causal = true, o.alibi_slopes = slopes, o.softcap = 4.0f; }},
      {"causal + sinks + left window 30", {1, 180, 180, 4, 2, 32, 32}, Sharding::zigzag,
       [](ForwardOptions& o) { o.causal = true, o.sinks = sinks, o.window_left = 30; }},
      {"sinks, not causal, contiguous", {1, 90, 90, 4, 4, 16, 16}, Sharding::contiguous,
       [](ForwardOptions& o) { o.sinks = sinks; }},
      {"windows of INT64_MAX - 1: unbounded", {1, 40, 40, 2, 2, 16, 16}, Sharding::zigzag,
       [](ForwardOptions& o) { o.window_left = o.window_right = std::numeric_limits<index_t>::max() - 1; }},
      {"N 1", {1, 1, 1, 2, 2, 8, 8}, Sharding::zigzag, [](ForwardOptions& o) { o.causal = true; }},
      {"N 5: some ranks hold no row", {1, 5, 5, 2, 1, 8, 8}, Sharding::zigzag, [](ForwardOptions& o) { o.causal = true; }},
  };
}

// Long enough for many kernel tiles per chunk pair.
std::vector<Config> large_configs() {
  return {{"causal N 1000", {1, 1000, 1000, 2, 1, 64, 64}, Sharding::zigzag, [](ForwardOptions& o) { o.causal = true; }}};
}

/// A rank's shard of one full BackwardProblem, the ring's outputs on it, and checks of
/// those outputs against full-sequence results cut to the same shard.
template <class T>
struct RingShard {
  ProblemShape s;
  ShardLayout layout;
  int rank;
  index_t n;
  std::vector<T> q, k, v, dout, o, dq, dk, dv;
  std::vector<float> lse;

  RingShard(const BackwardProblem<T>& full, ShardLayout l, MPI_Comm comm = MPI_COMM_WORLD)
      : s(full.s), layout(l), rank(0), n(0) {
    MPI_Comm_rank(comm, &rank);
    n = layout.local_len(rank);
    cut(full.qv, q, s.heads, s.head_dim);
    cut(full.kv, k, s.heads_kv, s.head_dim);
    cut(full.vv, v, s.heads_kv, s.head_dim_v);
    cut(full.dov, dout, s.heads, s.head_dim_v);
    o.assign(static_cast<std::size_t>(s.batch * n * s.heads * s.head_dim_v), from_float<T>(sentinel));
    dq.assign(static_cast<std::size_t>(s.batch * n * s.heads * s.head_dim), from_float<T>(sentinel));
    dk.assign(static_cast<std::size_t>(s.batch * n * s.heads_kv * s.head_dim), from_float<T>(sentinel));
    dv.assign(static_cast<std::size_t>(s.batch * n * s.heads_kv * s.head_dim_v), from_float<T>(sentinel));
    lse.assign(static_cast<std::size_t>(s.batch * s.heads * n), sentinel);
  }

  TensorView<T> view(std::vector<T>& x, index_t heads, index_t dim) { return make_bshd(x.data(), s.batch, n, heads, dim); }
  LseView lse_view() { return make_lse(lse.data(), s.batch, s.heads, n); }

  void forward(MPI_Comm comm, const ForwardOptions& opt, ring::RingStats* stats = nullptr) {
    ring::forward(comm, layout, view(q, s.heads, s.head_dim), view(k, s.heads_kv, s.head_dim),
                       view(v, s.heads_kv, s.head_dim_v), view(o, s.heads, s.head_dim_v), lse_view(), stats, opt);
  }
  void backward(MPI_Comm comm, const BackwardOptions& opt, ring::RingStats* stats = nullptr) {
    ring::backward(comm, layout, view(q, s.heads, s.head_dim), view(k, s.heads_kv, s.head_dim),
                        view(v, s.heads_kv, s.head_dim_v), view(o, s.heads, s.head_dim_v), lse_view(),
                        view(dout, s.heads, s.head_dim_v), view(dq, s.heads, s.head_dim),
                        view(dk, s.heads_kv, s.head_dim), view(dv, s.heads_kv, s.head_dim_v), stats, opt);
  }

  /// This rank's rows of a full [B, N, heads, dim] tensor (any element type), as doubles.
  template <class E>
  std::vector<double> rows_of(const std::vector<E>& full, index_t heads, index_t dim) const {
    return shard_rows(full, layout, rank, s.batch, s.seqlen_q, heads, dim);
  }
  /// The same for a full [B, H, N] LSE.
  template <class E>
  std::vector<double> lse_rows_of(const std::vector<E>& full) const {
    return shard_lse_rows(full, layout, rank, s.batch * s.heads, s.seqlen_q);
  }

  static std::vector<float> floats(const std::vector<T>& x) {
    std::vector<float> out;
    for (const T& e : x) out.push_back(to_float(e));
    return out;
  }

 private:
  void cut(const TensorView<T>& full, std::vector<T>& local, index_t heads, index_t dim) {
    local.resize(static_cast<std::size_t>(s.batch * n * heads * dim));
    ring::shard(full, make_bshd(local.data(), s.batch, n, heads, dim), layout, rank);
  }
};

/// got against want (grad_error: max |got - want| and max |want| over finite entries, and
/// a NaN/Inf pattern mismatch as `problem`).
GradError diff(const std::vector<float>& got, const std::vector<double>& want, const std::string& name) {
  return grad_error(got, want, name);
}

void check_fp32(const std::vector<Config>& cases) {
  for (const Config& c : cases) {
    SCOPED_TRACE(std::string(c.name) + ", " + std::to_string(world_size()) + " ranks");
    BackwardProblem<float> full(c.shape, 1000 + static_cast<std::uint64_t>(c.shape.seqlen_q));
    BackwardOptions opt;
    c.set(opt);
    std::vector<float> dsinks(static_cast<std::size_t>(c.shape.heads)), ring_dsinks(dsinks.size(), sentinel);
    if (!opt.sinks.empty()) opt.dsinks = dsinks;
    const reference::Options ref_opt = reference::Options::from(opt);
    reference::AttentionResult ref;
    reference::BackwardResult ref_grads;
    // The single process and the references on rank 0 alone, broadcast: the ranks share 2
    // cores under ctest, and the sanitizer builds run this suite six times.
    if (world_rank() == 0) {
      BackwardOptions single = opt;
      single.dsinks = {};
      full.forward(single);
      full.backward(opt);
      ref = reference::attention<float>(full.qv, full.kv, full.vv, ref_opt);
      ref_grads = full.reference(ref_opt);
    }
    for (auto* x : {&full.o, &full.dq, &full.dk, &full.dv}) broadcast(*x);
    broadcast(full.lse);
    broadcast(dsinks);
    broadcast(ref.o);
    broadcast(ref.lse);
    broadcast(ref_grads);

    RingShard<float> mine(full, ShardLayout(c.shape.seqlen_q, world_size(), c.sharding));
    opt.dsinks = {};
    mine.forward(MPI_COMM_WORLD, opt);
    if (!opt.sinks.empty()) opt.dsinks = ring_dsinks;
    mine.backward(MPI_COMM_WORLD, opt);

    const auto& s = c.shape;
    struct Check {
      const char* name;
      std::vector<float> got;
      std::vector<double> single, reference;
    };
    const Check checks[] = {
        {"o", mine.o, mine.rows_of(full.o, s.heads, s.head_dim_v), mine.rows_of(ref.o, s.heads, s.head_dim_v)},
        {"lse", mine.lse, mine.lse_rows_of(full.lse), mine.lse_rows_of(ref.lse)},
        {"dq", mine.dq, mine.rows_of(full.dq, s.heads, s.head_dim), mine.rows_of(ref_grads.dq, s.heads, s.head_dim)},
        {"dk", mine.dk, mine.rows_of(full.dk, s.heads_kv, s.head_dim), mine.rows_of(ref_grads.dk, s.heads_kv, s.head_dim)},
        {"dv", mine.dv, mine.rows_of(full.dv, s.heads_kv, s.head_dim_v), mine.rows_of(ref_grads.dv, s.heads_kv, s.head_dim_v)},
    };
    for (const Check& k : checks) {
      const GradError single = diff(k.got, k.single, std::string(k.name) + " vs single process");
      const GradError refd = diff(k.got, k.reference, std::string(k.name) + " vs reference");
      EXPECT_EQ(single.problem, "");
      EXPECT_EQ(refd.problem, "");
      // fp32 rounding: the ring merges P partial states (and sums P partial gradients)
      // where the single process runs one online softmax.
      EXPECT_LE(single.max_error, 4e-6 * std::max(single.magnitude, 1.0)) << k.name << ", magnitude " << single.magnitude;
      EXPECT_LE(refd.max_error, 2e-5 * std::max(refd.magnitude, 1.0)) << k.name << ", magnitude " << refd.magnitude;
    }
    if (!opt.sinks.empty()) {
      std::vector<double> want(dsinks.begin(), dsinks.end()), ref_want(ref_grads.dsinks.begin(), ref_grads.dsinks.end());
      const GradError single = diff(ring_dsinks, want, "dsinks"), refd = diff(ring_dsinks, ref_want, "dsinks vs reference");
      EXPECT_LE(single.max_error, 4e-6 * std::max(single.magnitude, 1.0)) << "dsinks";
      EXPECT_LE(refd.max_error, 2e-5 * std::max(refd.magnitude, 1.0)) << "dsinks vs reference";
      EXPECT_GT(refd.magnitude, 0.0);
    }
  }
}

TEST(Ring, Fp32MatchesSingleProcessAndReference) { check_fp32(configs()); }
TEST(Ring, LargeFp32MatchesSingleProcessAndReference) { check_fp32(large_configs()); }

// bf16 storage: the ring rounds each partial O to bf16 before its fp32 merge,
// so it is held to FlashAttention's rule against a naive bf16 implementation: 2x its
// forward error, 3x its gradient error.
void check_bf16(const std::vector<Config>& cases) {
  for (const Config& c : cases) {
    SCOPED_TRACE(c.name);
    BackwardProblem<bf16> full(c.shape, 77);
    BackwardOptions opt;
    c.set(opt);
    const reference::Options ref_opt = reference::Options::from(opt);
    reference::BackwardResult ref_grads;
    reference::NaiveBackwardF naive;
    if (world_rank() == 0) {
      ref_grads = full.reference(ref_opt);
      naive = full.naive(ref_opt);
    }
    broadcast(ref_grads);
    broadcast(naive);
    const auto& s = c.shape;
    // The forward reference and the naive bf16 forward take the same values as floats.
    std::vector<float> qf = RingShard<bf16>::floats(full.q), kf = RingShard<bf16>::floats(full.k),
                       vf = RingShard<bf16>::floats(full.v);
    const auto as_float_view = [](std::vector<float>& x, const std::vector<bf16>& buffer, const TensorView<bf16>& v) {
      return TensorView<const float>{x.data() + (v.data - buffer.data()), v.shape, v.stride};
    };
    const auto as_floats = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    reference::AttentionResult ref;
    std::vector<float> naive_o(static_cast<std::size_t>(s.batch * s.seqlen_q * s.heads * s.head_dim_v)),
        naive_lse(static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q));
    if (world_rank() == 0) {
      ref = reference::attention<float>(as_float_view(qf, full.q, full.qv), as_float_view(kf, full.k, full.kv),
                                        as_float_view(vf, full.v, full.vv), ref_opt);
      naive_same_precision<bf16>(as_float_view(qf, full.q, full.qv), as_float_view(kf, full.k, full.kv),
                                 as_float_view(vf, full.v, full.vv), ref_opt,
                                 make_bshd(naive_o.data(), s.batch, s.seqlen_q, s.heads, s.head_dim_v),
                                 make_lse(naive_lse.data(), s.batch, s.heads, s.seqlen_q));
    }
    broadcast(ref.o);
    broadcast(ref.lse);
    broadcast(naive_o);
    broadcast(naive_lse);

    RingShard<bf16> mine(full, ShardLayout(s.seqlen_q, world_size(), c.sharding));
    mine.forward(MPI_COMM_WORLD, opt);
    mine.backward(MPI_COMM_WORLD, opt);
    const auto bound = [](const GradError& got, const GradError& naive, double factor, const char* name) {
      EXPECT_EQ(got.problem, "");
      EXPECT_LE(got.max_error, factor * naive.max_error + 1e-5 * std::max(got.magnitude, 1.0))
          << name << ": naive bf16 error " << naive.max_error << ", magnitude " << got.magnitude;
      EXPECT_GT(naive.max_error, 0.0) << name << ": the naive error is 0, the bound cannot fail";
    };
    const std::vector<double> want_o = mine.rows_of(ref.o, s.heads, s.head_dim_v);
    bound(diff(RingShard<bf16>::floats(mine.o), want_o, "o"),
          diff(as_floats(mine.rows_of(naive_o, s.heads, s.head_dim_v)), want_o, "naive o"), 2.0, "o");
    const std::vector<double> want_lse = mine.lse_rows_of(ref.lse);
    bound(diff(mine.lse, want_lse, "lse"), diff(as_floats(mine.lse_rows_of(naive_lse)), want_lse, "naive lse"), 2.0, "lse");
    const struct {
      const char* name;
      const std::vector<bf16>& got;
      const std::vector<double>& ref;
      const std::vector<float>& naive;
      index_t heads, dim;
    } grads[] = {{"dq", mine.dq, ref_grads.dq, naive.dq, s.heads, s.head_dim},
                 {"dk", mine.dk, ref_grads.dk, naive.dk, s.heads_kv, s.head_dim},
                 {"dv", mine.dv, ref_grads.dv, naive.dv, s.heads_kv, s.head_dim_v}};
    for (const auto& g : grads) {
      const std::vector<double> want = mine.rows_of(g.ref, g.heads, g.dim);
      const std::vector<double> naive_rows = mine.rows_of(g.naive, g.heads, g.dim);
      bound(diff(RingShard<bf16>::floats(g.got), want, g.name),
            diff(as_floats(naive_rows), want, "naive"), 3.0, g.name);
    }
  }
}

TEST(Ring, Bf16WithinFlashAttentionsRule) {
  check_bf16({{"bf16 causal zig-zag GQA", {1, 301, 301, 4, 2, 64, 64}, Sharding::zigzag, [](ForwardOptions& o) { o.causal = true; }},
              {"bf16 window, contiguous", {2, 150, 150, 2, 2, 32, 32}, Sharding::contiguous,
               [](ForwardOptions& o) { o.window_left = 33, o.window_right = 5; }}});
}
TEST(Ring, LargeBf16WithinFlashAttentionsRule) {
  check_bf16({{"bf16 causal N 1024, MQA", {1, 1024, 1024, 2, 1, 64, 64}, Sharding::zigzag,
               [](ForwardOptions& o) { o.causal = true; }}});
}

// Large scores (integer Q and K, near one-hot rows, LSEs of 1e3 to 3e4): one float LSE per
// pair would make its rounding (|LSE| 2^-24) each pair's relative weight error in the
// forward's merge and P's relative error in the backward, so the ring merges each pair's
// max and sum kept apart and the backward recomputes the row statistics over every rank's
// keys (one more forward pass). ring_fuzz found it (Q 1234.5 everywhere: dV 3000x the naive
// float error); before the fix dV here was 300 to 10000x the single process's error.
// O and dV (sums of P times values, no cancellation) are held to FlashAttention's rule;
// dQ and dK, where P (dP - D) cancels to nearly nothing and the naive backward is exact by
// luck (P = 1, D = dP bit for bit), to the rule plus backward_fuzz.cpp's floor for the
// rounding of the terms that cancelled (support/backward_rule.hpp, cancelling_terms).
template <class T>
void check_large_scores(double magnitude, bool sink_and_softcap, Sharding sharding, std::uint64_t seed) {
  SCOPED_TRACE("scores near " + std::to_string(magnitude) + " in " + std::string(type_name<T>()) +
               (sink_and_softcap ? " with a sink and a softcap" : "") + ", " + std::to_string(world_size()) + " ranks");
  const ProblemShape s{2, 77, 77, 2, 1, 32, 32};
  BackwardProblem<T> full(s, seed);
  BackwardOptions opt;
  opt.causal = sharding == Sharding::zigzag;
  opt.softmax_scale = large_score_inputs(full, magnitude, seed);
  const std::vector<float> sink_values{static_cast<float>(magnitude * 0.9), -1.0f};
  std::vector<float> dsinks(2, sentinel);
  if (sink_and_softcap) {
    opt.softcap = static_cast<float>(2.0 * magnitude);
    opt.sinks = sink_values;
  }
  const reference::Options ref_opt = reference::Options::from(opt);
  reference::AttentionResult ref_o;
  reference::BackwardResult ref;
  reference::NaiveBackwardF naive;
  if (world_rank() == 0) {
    if constexpr (std::is_same_v<T, float>) ref_o = reference::attention<T>(full.qv, full.kv, full.vv, ref_opt);
    ref = full.reference(ref_opt);
    naive = full.naive(ref_opt);
  }
  broadcast(ref_o.o);
  broadcast(ref);
  broadcast(naive);
  RingShard<T> mine(full, ShardLayout(s.seqlen_q, world_size(), sharding));
  mine.forward(MPI_COMM_WORLD, opt);
  if (sink_and_softcap) opt.dsinks = dsinks;
  mine.backward(MPI_COMM_WORLD, opt);
  const auto floats = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const auto naive_rows = [&](const std::vector<float>& x, index_t heads, index_t dim) {
    return floats(mine.rows_of(x, heads, dim));
  };
  if constexpr (std::is_same_v<T, float>) {
    // O: the exact merge leaves the ring within a few roundings of the reference (the
    // rule's 2x naive is no use here: a naive float O of a one-hot row is exact).
    const GradError eo = grad_error(mine.o, mine.rows_of(ref_o.o, s.heads, s.head_dim_v), "o");
    EXPECT_EQ(eo.problem, "");
    EXPECT_LE(eo.max_error, 1e-5 * eo.magnitude) << "o, magnitude " << eo.magnitude;
  }
  expect_within_rule<T>(RingShard<T>::floats(mine.dv), mine.rows_of(ref.dv, s.heads_kv, s.head_dim_v),
                        naive_rows(naive.dv, s.heads_kv, s.head_dim_v), "dv", false);
  CancellingTerms terms;
  if (world_rank() == 0) terms = cancelling_terms(full, ref_opt, *opt.softmax_scale);
  broadcast(terms.dq);
  broadcast(terms.dk);
  expect_within_rule_and_floor<T>(RingShard<T>::floats(mine.dq), mine.rows_of(ref.dq, s.heads, s.head_dim),
                                  naive_rows(naive.dq, s.heads, s.head_dim), mine.rows_of(terms.dq, s.heads, s.head_dim),
                                  "dq");
  expect_within_rule_and_floor<T>(RingShard<T>::floats(mine.dk), mine.rows_of(ref.dk, s.heads_kv, s.head_dim),
                                  naive_rows(naive.dk, s.heads_kv, s.head_dim),
                                  mine.rows_of(terms.dk, s.heads_kv, s.head_dim), "dk");
  if (sink_and_softcap) expect_within_rule<T>(dsinks, ref.dsinks, naive.dsinks, "dsinks", false);
}

TEST(Ring, LargeScoresKeepTheRule) {
  check_large_scores<float>(1e3, false, Sharding::zigzag, 40);
  check_large_scores<float>(1e4, false, Sharding::zigzag, 41);
  check_large_scores<float>(3e4, false, Sharding::contiguous, 44);
  check_large_scores<bf16>(1e4, false, Sharding::zigzag, 42);
  check_large_scores<float>(1e4, true, Sharding::zigzag, 47);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The merge order is fixed (step, then chunk pair) and the kernels' bits do not depend on
// the thread count, so neither do the ring's; a second run gives the same bits.
TEST(Ring, SameBitsEveryRunAndThreadCount) {
  BackwardProblem<float> full({2, 333, 333, 4, 2, 48, 48}, 9);
  BackwardOptions opt;
  opt.causal = true;
  opt.window_left = 100;
  const ShardLayout layout(333, world_size());
  RingShard<float> first(full, layout), second(full, layout), serial(full, layout);
  first.forward(MPI_COMM_WORLD, opt);
  first.backward(MPI_COMM_WORLD, opt);
  second.forward(MPI_COMM_WORLD, opt);
  second.backward(MPI_COMM_WORLD, opt);
  opt.execution = {Backend::serial, 1};
  serial.forward(MPI_COMM_WORLD, opt);
  serial.backward(MPI_COMM_WORLD, opt);
  for (const RingShard<float>* other : {&second, &serial}) {
    EXPECT_TRUE(same_bits(first.o, other->o));
    EXPECT_TRUE(same_bits(first.lse, other->lse));
    EXPECT_TRUE(same_bits(first.dq, other->dq));
    EXPECT_TRUE(same_bits(first.dk, other->dk));
    EXPECT_TRUE(same_bits(first.dv, other->dv));
  }
}

// A communicator of one rank: the ring is the local kernel, bit for bit.
TEST(Ring, OneRankIsTheLocalKernel) {
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank(), 0, &self);
  BackwardProblem<float> full({1, 150, 150, 2, 2, 32, 32}, 4);
  BackwardOptions opt;
  opt.causal = true;
  full.forward(opt);
  full.backward(opt);
  RingShard<float> mine(full, ShardLayout(150, 1), self);
  ring::RingStats stats;
  mine.forward(self, opt, &stats);
  EXPECT_EQ(stats.steps, 1);
  EXPECT_EQ(stats.bytes_sent, 0u);
  mine.backward(self, opt);
  EXPECT_TRUE(same_bits(mine.o, full.o));
  EXPECT_TRUE(same_bits(mine.lse, full.lse));
  EXPECT_TRUE(same_bits(mine.dq, full.dq));
  EXPECT_TRUE(same_bits(mine.dk, full.dk));
  EXPECT_TRUE(same_bits(mine.dv, full.dv));
  MPI_Comm_free(&self);
}

// P steps; the forward sends P - 1 K/V blocks of the longest shard, the backward P - 1
// blocks and P fp32 dK/dV accumulators.
TEST(Ring, StatsCountStepsAndBytes) {
  const ProblemShape sh{1, 101, 101, 4, 2, 32, 16};
  BackwardProblem<float> full(sh, 5);
  BackwardOptions opt;
  opt.causal = true;
  const ShardLayout layout(101, world_size());
  RingShard<float> mine(full, layout);
  ring::RingStats f, b;
  mine.forward(MPI_COMM_WORLD, opt, &f);
  mine.backward(MPI_COMM_WORLD, opt, &b);
  const int P = world_size();
  const auto block = static_cast<std::uint64_t>(layout.max_local_len() * sh.heads_kv * (sh.head_dim + sh.head_dim_v));
  EXPECT_EQ(f.steps, P);
  EXPECT_EQ(f.step_compute_seconds.size(), static_cast<std::size_t>(P));
  EXPECT_EQ(f.bytes_sent, P == 1 ? 0u : (P - 1) * block * sizeof(float));
  EXPECT_EQ(b.bytes_sent, P == 1 ? 0u : (P - 1) * block * sizeof(float) + P * block * sizeof(float));
  EXPECT_GE(f.seconds, f.compute_seconds);
}

// The former argument order, stats after the options (deprecated, docs/api.md): the same
// call as stats before them, bit for bit, with the same statistics; and the form without an
// LSE, in both orders.
TEST(Ring, FormerStatsOrderIsTheSameCall) {
  const ProblemShape sh{1, 101, 101, 4, 2, 32, 16};
  BackwardProblem<float> full(sh, 8);
  BackwardOptions opt;
  opt.causal = true;
  const ShardLayout layout(101, world_size());
  RingShard<float> now(full, layout), former(full, layout);
  ring::RingStats fn, bn, ff, bf, no_lse_now, no_lse_former;
  now.forward(MPI_COMM_WORLD, opt, &fn);
  now.backward(MPI_COMM_WORLD, opt, &bn);
  const auto q = former.view(former.q, sh.heads, sh.head_dim), k = former.view(former.k, sh.heads_kv, sh.head_dim),
             v = former.view(former.v, sh.heads_kv, sh.head_dim_v);
  const auto o = former.view(former.o, sh.heads, sh.head_dim_v);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ring::forward(MPI_COMM_WORLD, layout, q, k, v, o, former.lse_view(), opt, &ff);
  ring::backward(MPI_COMM_WORLD, layout, q, k, v, o, former.lse_view(),
                 former.view(former.dout, sh.heads, sh.head_dim_v), former.view(former.dq, sh.heads, sh.head_dim),
                 former.view(former.dk, sh.heads_kv, sh.head_dim), former.view(former.dv, sh.heads_kv, sh.head_dim_v),
                 opt, &bf);
  std::vector<float> o_former(former.o.size(), sentinel), o_now(former.o.size(), sentinel);
  ring::forward(MPI_COMM_WORLD, layout, q, k, v, make_bshd(o_former.data(), sh.batch, former.n, sh.heads, sh.head_dim_v),
                opt, &no_lse_former);
#pragma GCC diagnostic pop
  ring::forward(MPI_COMM_WORLD, layout, q, k, v, make_bshd(o_now.data(), sh.batch, former.n, sh.heads, sh.head_dim_v),
                &no_lse_now, opt);
  EXPECT_TRUE(same_bits(former.o, now.o));
  EXPECT_TRUE(same_bits(former.lse, now.lse));
  EXPECT_TRUE(same_bits(former.dq, now.dq));
  EXPECT_TRUE(same_bits(former.dk, now.dk));
  EXPECT_TRUE(same_bits(former.dv, now.dv));
  EXPECT_TRUE(same_bits(o_former, now.o));
  EXPECT_TRUE(same_bits(o_now, now.o));
  for (const ring::RingStats* st : {&fn, &bn, &ff, &bf, &no_lse_now, &no_lse_former}) EXPECT_EQ(st->steps, world_size());
  EXPECT_EQ(ff.bytes_sent, fn.bytes_sent);
  EXPECT_EQ(bf.bytes_sent, bn.bytes_sent);
  EXPECT_EQ(no_lse_former.bytes_sent, fn.bytes_sent);
  EXPECT_EQ(no_lse_now.bytes_sent, fn.bytes_sent);
}

// A NaN in one key reaches exactly the rows that see that key, as in the single process.
TEST(Ring, NanReachesTheRowsThatSeeIt) {
  BackwardProblem<float> full({1, 200, 200, 2, 2, 16, 16}, 6);
  full.k[static_cast<std::size_t>(120 * 2 * 16 + 3)] = std::numeric_limits<float>::quiet_NaN();  // key 120, head 0
  ForwardOptions opt;
  opt.causal = true;
  opt.window_left = 50;
  full.forward(opt);
  RingShard<float> mine(full, ShardLayout(200, world_size()));
  mine.forward(MPI_COMM_WORLD, opt);
  const std::vector<double> want = mine.rows_of(full.o, 2, 16);
  const GradError d = diff(mine.o, want, "o");
  EXPECT_EQ(d.problem, "");
  EXPECT_LE(d.max_error, 4e-6 * std::max(d.magnitude, 1.0));
  EXPECT_EQ(std::count_if(full.o.begin(), full.o.end(), [](float x) { return std::isnan(x); }), 51 * 16);
}

/// Runs f on every rank; returns the parameter its invalid_argument named ("" if none).
template <class F>
std::string thrown_parameter(F&& f) {
  try {
    f();
  } catch (const invalid_argument& e) {
    return e.parameter();
  }
  return "";
}

/// The what() of the invalid_argument f throws ("" if none).
template <class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "";
}

// An option that differs across ranks is reported with its values: floats as floats (issue
// 27: a softcap of 30 read "1106247680", its bits), arrays as differing.
TEST(Ring, DisagreementsPrintTheValues) {
  const int P = world_size(), last = P - 1;
  if (P == 1) return;
  const bool on_last = world_rank() == last;
  BackwardProblem<float> full({1, 64, 64, 4, 2, 16, 16}, 8);
  const ShardLayout layout(64, P);
  const std::vector<float> slopes{0.5f, 0.25f, 0.125f, 0.0625f}, other_slopes{0.5f, 0.25f, 0.125f, 0.0f};
  const auto message = [&](auto&& change) {
    RingShard<float> mine(full, layout);
    ForwardOptions o;
    change(o);
    return thrown_message([&] { mine.forward(MPI_COMM_WORLD, o); });
  };
  const std::string last_has = ", rank " + std::to_string(last) + " has ";
  std::string m = message([&](ForwardOptions& o) { o.softcap = on_last ? 30.0f : 0.0f; });
  EXPECT_NE(m.find("softcap: differs across ranks: rank 0 has 0" + last_has + "30"), std::string::npos) << m;
  EXPECT_EQ(m.find("1106247680"), std::string::npos) << m;
  m = message([&](ForwardOptions& o) { o.softmax_scale = on_last ? 0.1f : 0.125f; });
  EXPECT_NE(m.find("softmax_scale: differs across ranks: rank 0 has 0.125" + last_has + "0.100000001"),
            std::string::npos) << m;
  m = message([&](ForwardOptions& o) { o.alibi_slopes = on_last ? other_slopes : slopes; });
  EXPECT_NE(m.find("alibi_slopes: differs across ranks: rank 0's and rank " + std::to_string(last) +
                   "'s values are not the same"), std::string::npos) << m;
}

// Every rank throws the same parameter, before any transfer, and writes nothing.
TEST(Ring, ErrorsAreCollectiveAndWriteNothing) {
  const int P = world_size(), last = P - 1;
  const bool on_last = world_rank() == last;
  BackwardProblem<float> full({1, 64, 64, 4, 2, 16, 16}, 8);
  const ShardLayout layout(64, P);
  ForwardOptions opt;
  opt.causal = true;
  const auto check = [&](const char* want, auto&& call) {
    RingShard<float> mine(full, layout);
    EXPECT_EQ(thrown_parameter([&] { call(mine); }), want);
    EXPECT_TRUE(std::all_of(mine.o.begin(), mine.o.end(), [](float x) { return x == sentinel; })) << want;
    EXPECT_TRUE(std::all_of(mine.lse.begin(), mine.lse.end(), [](float x) { return x == sentinel; })) << want;
    EXPECT_TRUE(std::all_of(mine.dq.begin(), mine.dq.end(), [](float x) { return x == sentinel; })) << want;
  };
  check("layout", [&](RingShard<float>& m) {
    m.layout = ShardLayout(64, P + 1);
    m.forward(MPI_COMM_WORLD, opt);
  });
  check("bias", [&](RingShard<float>& m) {
    std::vector<float> bias(64 * 64);
    ForwardOptions o = opt;
    o.bias = {bias.data(), {1, 1, 64, 64}, {0, 0, 64, 1}};
    m.forward(MPI_COMM_WORLD, o);
  });
  check("diagonal_offset", [&](RingShard<float>& m) {
    BackwardOptions o;
    o.diagonal_offset = 0;
    m.backward(MPI_COMM_WORLD, o);
  });
  check("q", [&](RingShard<float>& m) {  // the last rank's shard one row short
    TensorView<float> q = m.view(m.q, 4, 16);
    if (on_last) q.shape[1] -= 1;
    ring::forward(MPI_COMM_WORLD, m.layout, q, m.view(m.k, 2, 16), m.view(m.v, 2, 16), m.view(m.o, 4, 16),
                       m.lse_view(), opt);
  });
  check("softmax_scale", [&](RingShard<float>& m) {  // an error only the last rank's checks see
    ForwardOptions o = opt;
    if (on_last) o.softmax_scale = -1.0f;
    m.forward(MPI_COMM_WORLD, o);
  });
  if (P == 1) return;  // the rest differ across ranks
  check("causal", [&](RingShard<float>& m) {
    ForwardOptions o = opt;
    o.causal = !on_last;
    m.forward(MPI_COMM_WORLD, o);
  });
  check("heads_kv", [&](RingShard<float>& m) {  // MQA on one rank: each rank's views are valid
    TensorView<float> k = m.view(m.k, 2, 16), v = m.view(m.v, 2, 16);
    if (on_last) k.shape[2] = v.shape[2] = 1;
    ring::forward(MPI_COMM_WORLD, m.layout, m.view(m.q, 4, 16), k, v, m.view(m.o, 4, 16), m.lse_view(), opt);
  });
  check("window_left", [&](RingShard<float>& m) {
    BackwardOptions o;
    o.causal = true;
    o.window_left = on_last ? 3 : 4;
    m.backward(MPI_COMM_WORLD, o);
  });
}

}  // namespace
}  // namespace tileattn::test

// Every rank runs every test; rank 0 prints, and all ranks return the same verdict. With
// RING_TEST_MPI_THREAD=serialized, MPI allows the ring's progress thread, so the transfers
// move on it rather than between kernels (both paths are registered with ctest).
// RING_TEST_ALL_PRINT=1 (mpirun -x) lets every rank print its failures, not rank 0 alone.
int main(int argc, char** argv) {
  const char* level = std::getenv("RING_TEST_MPI_THREAD");
  const bool serialized = level && std::string(level) == "serialized";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED, &provided);
  if (serialized != tileattn::ring::detail::BackgroundProgress::allowed()) {
    std::fprintf(stderr, "ring_test: asked for %s, MPI provided thread level %d\n", level ? level : "funneled", provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (tileattn::test::world_rank() != 0 && !std::getenv("RING_TEST_ALL_PRINT")) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::fprintf(stderr, "ring_test: rank %d failed\n", tileattn::test::world_rank());
  MPI_Finalize();
  return any_failed;
}
