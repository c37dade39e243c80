// tests/variants/combinations_test.cpp: every feature combines with every other and with
// every backend. All 128 subsets of {GQA, window, varlen, causal, softcap, ALiBi, sinks},
// each with top-left alignment, a bias and a mask rotated in, on a rotating head_dim,
// backend and thread count, against the reference; and bitwise identical outputs across
// backends and thread counts for a case combining everything, fixed-length and varlen.
#include <gtest/gtest.h>

#include <cstdlib>

#include <bit>
#include <sstream>

#include "variants_support.hpp"

namespace tileattn::test {
namespace {

enum Feature : unsigned {
  gqa = 1u << 0,
  window = 1u << 1,
  varlen = 1u << 2,
  causal = 1u << 3,
  softcap = 1u << 4,
  alibi = 1u << 5,
  sinks = 1u << 6,
  // Rotated in, not enumerated:
  top_left = 1u << 7,
  bias = 1u << 8,
  mask = 1u << 9,
};
constexpr unsigned enumerated_features = 7;
constexpr const char* feature_names[] = {"gqa",  "window", "varlen", "causal", "softcap",
                                         "alibi", "sinks", "topleft", "bias",  "mask"};

struct Combination {
  unsigned features;
  index_t head_dim;
  Backend backend;
  int threads;
};

std::string case_name(const Combination& c) {
  std::string name;
  for (unsigned f = 0; f < 10; ++f)
    if (c.features & (1u << f)) name += std::string(name.empty() ? "" : "_") + feature_names[f];
  if (name.empty()) name = "plain";
  const char* backend = c.backend == Backend::serial ? "serial" : c.backend == Backend::openmp ? "omp" : "tbb";
  return name + "_d" + std::to_string(c.head_dim) + "_" + backend + std::to_string(c.threads);
}

std::vector<Combination> all_combinations() {
  const auto backends = compiled_backends();
  std::vector<Combination> out;
  for (unsigned subset = 0; subset < (1u << enumerated_features); ++subset) {
    // The three extras follow bits of a scrambled index, so each is on in half the subsets
    // and meets every enumerated feature both on and off.
    const unsigned scrambled = (subset * 37u + 11u) % 128u;
    const unsigned extras = ((scrambled & 1u) ? top_left : 0u) | ((scrambled & 2u) ? bias : 0u) |
                            ((scrambled & 4u) ? mask : 0u);
    out.push_back({subset | extras,
                   test_head_dims[subset % test_head_dims.size()],
                   backends[subset % backends.size()], 1 + static_cast<int>(subset / 3 % 3)});
  }
  return out;
}

/// The inputs every combination may need, sized for the problem.
struct ModifierInputs {
  ScoreBuffer<float> bias_values;
  ScoreBuffer<bool> mask_values;
  std::vector<float> slopes, sink_logits;
};

ModifierInputs make_inputs(index_t batch, index_t heads, index_t nq, index_t nk, bool per_batch_slopes) {
  return {random_bias({batch, 1, nq, nk}, ScoreLayout::transposed, 91, 1.5f),
          random_mask({1, heads, nq, nk}, ScoreLayout::contiguous, 92, 0.8),
          uniform_values(static_cast<std::size_t>((per_batch_slopes ? batch : 1) * heads), 0.0f, 0.4f, 93),
          uniform_values(static_cast<std::size_t>(heads), -1.0f, 2.0f, 94)};
}

ForwardOptions options_for(const Combination& c, const ModifierInputs& in) {
  const unsigned f = c.features;
  ForwardOptions opts;
  opts.execution = {c.backend, c.threads};
  opts.sram_budget_bytes = rows_budget(16, c.head_dim);
  opts.causal = f & causal;
  if (f & window) {
    opts.window_left = 12;
    opts.window_right = 5;  // ignored (0) when causal
  }
  if (f & top_left) opts.alignment = MaskAlignment::top_left;
  if (f & softcap) opts.softcap = 3.0f;
  if (f & alibi) opts.alibi_slopes = in.slopes;
  if (f & sinks) opts.sinks = in.sink_logits;
  if (f & bias) opts.bias = in.bias_values.view();
  if (f & mask) opts.mask = in.mask_values.view();
  return opts;
}

constexpr unsigned everything = gqa | window | causal | softcap | alibi | sinks | bias | mask;

class EveryCombination : public ::testing::TestWithParam<Combination> {};

TEST_P(EveryCombination, MatchesReference) {
  const Combination& c = GetParam();
  const index_t heads_q = (c.features & gqa) ? 6 : 3, heads_kv = (c.features & gqa) ? 2 : 3;
  if (c.features & varlen) {
    // Sequences: ordinary, empty queries, empty keys, more queries than keys.
    VarlenProblem p({29, 0, 41, 50}, {33, 12, 0, 7}, heads_q, heads_kv, c.head_dim, c.features);
    const ModifierInputs in = make_inputs(p.batch(), heads_q, p.max_q(), p.max_k(), true);
    const ForwardOptions opts = options_for(c, in);
    EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
    EXPECT_EQ(p.spare_rows_written(), 0);
  } else {
    // Alternate Nq < Nk and Nq > Nk.
    const bool wide = (c.features >> 3) % 2 == 0;
    Problem p({2, heads_q, heads_kv, wide ? 41 : 59, wide ? 59 : 41, c.head_dim},
              std::popcount(c.features) % 2 ? KvStorage::interleaved : KvStorage::window, c.features);
    const ModifierInputs in = make_inputs(2, heads_q, p.shape().seqlen_q, p.shape().seqlen_k, c.features % 3 == 0);
    const ForwardOptions opts = options_for(c, in);
    EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  }
}

INSTANTIATE_TEST_SUITE_P(Subsets, EveryCombination, ::testing::ValuesIn(all_combinations()),
                         [](const auto& info) { return case_name(info.param); });

// Two larger cases (the reference costs O(Nq Nk d) in double): every feature at once on
// FlashAttention's awkward 1023 x 1024-like sizes, GQA 8/2 and 65/5, with K/V interleaved.
TEST(LargeCombinations, EveryFeatureAtOnce) {
  struct Large {
    Shape shape;
    MaskAlignment alignment;
  };
  for (const Large& c : {Large{{1, 8, 2, 1023, 1024, 64}, MaskAlignment::bottom_right},
                         Large{{1, 65, 5, 257, 600, 32}, MaskAlignment::top_left}}) {
    const Shape& s = c.shape;
    SCOPED_TRACE(std::to_string(s.heads_q) + "/" + std::to_string(s.heads_kv) + " " +
                 std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k));
    Problem p(s, KvStorage::interleaved, 97);
    const ModifierInputs in = make_inputs(s.batch, s.heads_q, s.seqlen_q, s.seqlen_k, false);
    ForwardOptions opts = options_for({everything, s.head_dim, Backend::automatic, 0}, in);
    opts.window_left = 300;
    opts.alignment = c.alignment;
    opts.sram_budget_bytes = 0;  // the detected L2: the plan a user gets
    EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  }
}

// ---- Bitwise identical across backends and thread counts ------------------------------------

std::vector<Execution> every_execution() {
  std::vector<Execution> out{{Backend::automatic, 0}};
  for (Backend b : compiled_backends())
    for (int threads : {1, 2, 3}) out.push_back({b, threads});
  return out;
}

std::string describe(const Execution& e) {
  return std::string(to_string(e.backend)) + " x " + std::to_string(e.num_threads);
}

/// Re-runs p under every backend and thread count: O and LSE must match the first run bit for bit.
/// `repeats` times each (races show up as rare differences).
template <class AnyProblem>
void expect_same_bits_on_every_execution(AnyProblem& p, ForwardOptions opts, int repeats = 1) {
  const std::vector<float> want = p.outputs();
  for (const Execution& e : every_execution())
    for (int r = 0; r < (e.backend == Backend::serial ? 1 : repeats); ++r) {
      opts.execution = e;
      p.reset_outputs();
      p.run(opts);
      ASSERT_TRUE(bitwise_equal(p.outputs(), want)) << describe(e) << ", run " << r;
    }
}

TEST(Determinism, CombinedOptionsBitwiseIdenticalOnEveryBackend) {
  const Combination c{everything, 64, Backend::serial, 1};
  Problem p({2, 8, 2, 97, 131, c.head_dim}, KvStorage::interleaved, 95);
  const ModifierInputs in = make_inputs(2, 8, 97, 131, true);
  ForwardOptions opts = options_for(c, in);
  opts.window_left = 40;
  p.run(opts);
  EXPECT_TRUE(within_bounds(compare_to_reference(p.reference(opts), p.o().cview(), p.lse().view())));
  expect_same_bits_on_every_execution(p, opts);
}

TEST(Determinism, VarlenBitwiseIdenticalOnEveryBackend) {
  const Combination c{everything | top_left, 32, Backend::serial, 1};
  VarlenProblem p({70, 0, 5, 130, 33}, {90, 4, 0, 130, 20}, 6, 3, c.head_dim, 96);
  const ModifierInputs in = make_inputs(p.batch(), 6, p.max_q(), p.max_k(), true);
  ForwardOptions opts = options_for(c, in);
  EXPECT_TRUE(within_bounds(p.run_and_compare(opts)));
  expect_same_bits_on_every_execution(p, opts);
}

// Every backend at 1, 2 and 3 threads (3 oversubscribes this 2-core machine), each run
// determinism_repeats() times: fixed-length with every option, varlen with every option,
// and a plain call at an odd head_dim with head_dim_v apart.
TEST(Determinism, RepeatedRunsOnEveryBackendAndThreadCount) {
  const int repeats = determinism_repeats();
  {
    const Combination c{everything, 48, Backend::serial, 1};
    Problem p({2, 6, 2, 61, 90, c.head_dim}, KvStorage::interleaved, 97);
    const ModifierInputs in = make_inputs(2, 6, 61, 90, true);
    ForwardOptions opts = options_for(c, in);
    opts.window_left = 30;
    opts.sram_budget_bytes = rows_budget(16, c.head_dim);
    opts.execution = {Backend::serial, 1};
    p.run(opts);
    expect_same_bits_on_every_execution(p, opts, repeats);
  }
  {
    const Combination c{everything | top_left, 32, Backend::serial, 1};
    VarlenProblem p({40, 0, 5, 70}, {50, 4, 0, 70}, 6, 3, c.head_dim, 98);
    const ModifierInputs in = make_inputs(p.batch(), 6, p.max_q(), p.max_k(), true);
    ForwardOptions opts = options_for(c, in);
    opts.execution = {Backend::serial, 1};
    p.run(opts);
    expect_same_bits_on_every_execution(p, opts, repeats);
  }
}

}  // namespace
}  // namespace tileattn::test
