// tests/kernels/forward_precision_test.cpp: tileattn::forward and forward_varlen with Q, K, V and
// O stored in bf16 and fp16, held to FlashAttention's own accuracy rule: the kernel's max
// absolute error against a double-precision reference is at most twice that of a naive
// attention in the same precision, plus 1e-5, on O and on the (float) LSE.
//
//   * Inputs are drawn from N(0, 1) with fixed seeds and rounded to T; the double reference
//     (reference::attention) runs on float copies of the ROUNDED inputs, so input rounding
//     is nobody's error.
//   * The naive same-precision attention (naive_same_precision<T> below) is "the way a plain
//     implementation does it": S = fp32 dot(q_i, k_j) * scale rounded to T; softcap, masks,
//     bias, ALiBi and sinks in fp32 with the reference's semantics and order; a max-subtracted
//     softmax in fp32; unnormalized P = exp(s - max) rounded to T; O = sum_j P_T[j] V[j] in
//     fp32, divided by the fp32 sum and rounded to T; LSE = max + log(sum) in fp32.
//   * The cases cover awkward sizes (seqlen 1 to 300, head dims 1 to 256, dv != d, batch 1-2,
//     GQA and MQA) and every forward option per type: causal (both alignments), sliding
//     windows, softcap, ALiBi (per head and per sequence), sinks, additive bias (full and
//     broadcast), boolean mask (with a row that sees nothing), custom softmax scales, small
//     SRAM budgets and varlen batches with empty sequences.
// Besides: bitwise determinism over every compiled backend at 1, 2 and 3 threads; the HBM
// byte counts in 2-byte elements; a check that the rule catches real option bugs (so it is
// not too loose to fail); and the error figures docs quote, printed by the test
// ForwardPrecision/*.PrintsErrorFiguresForDocs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/naive_same_precision.hpp"
#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

// ---- Cases ------------------------------------------------------------------------------------

/// The score modifiers a case turns on; their values are drawn from the case's seed.
struct Mods {
  bool bias = false;                // N(0, 1) additive bias [B, Hq, Nq, Nk]
  bool bias_broadcast = false;      // ... as [1, 1, Nq, Nk]
  bool mask = false;                // boolean mask [1, Hq, Nq, Nk], 70% true; query 0 of head 0 sees nothing
  bool alibi = false;               // one slope per query head, uniform in [0.02, 0.5)
  bool alibi_per_sequence = false;  // B x Hq slopes instead
  bool sinks = false;               // one logit per query head, uniform in [-1, 3)
};

struct Case {
  std::string name;
  index_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 1, head_dim_v = 1;
  ForwardOptions options{};       // masks, softcap, scale, budget (bias, mask, ALiBi, sinks: from mods)
  Mods mods{};
  bool budget_16x32 = false;      // budget: 16 packed rows beside the fixed key tiles of T's operands
  std::vector<std::int32_t> q_lens{}, k_lens{};  // varlen when not empty (batch = their size)
  std::uint64_t seed = 1;

  bool varlen() const { return !q_lens.empty(); }
  index_t total_q() const { return std::accumulate(q_lens.begin(), q_lens.end(), index_t{0}); }
  index_t total_k() const { return std::accumulate(k_lens.begin(), k_lens.end(), index_t{0}); }
};

Case fixed(std::string name, index_t batch, index_t nq, index_t nk, index_t hq, index_t hkv, index_t d,
           index_t dv, std::uint64_t seed) {
  Case c;
  c.name = std::move(name);
  c.batch = batch;
  c.seqlen_q = nq;
  c.seqlen_k = nk;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.head_dim_v = dv;
  c.seed = seed;
  return c;
}

Case varlen(std::string name, std::vector<std::int32_t> q_lens, std::vector<std::int32_t> k_lens, index_t hq,
            index_t hkv, index_t d, index_t dv, std::uint64_t seed) {
  Case c = fixed(std::move(name), static_cast<index_t>(q_lens.size()),
                 *std::max_element(q_lens.begin(), q_lens.end()), *std::max_element(k_lens.begin(), k_lens.end()),
                 hq, hkv, d, dv, seed);
  c.q_lens = std::move(q_lens);
  c.k_lens = std::move(k_lens);
  return c;
}

enum class Group { shapes, masks, score_mods, budgets, varlen };
constexpr Group all_groups[] = {Group::shapes, Group::masks, Group::score_mods, Group::budgets, Group::varlen};

std::vector<Case> cases_of(Group g) {
  std::vector<Case> out;
  const auto add = [&](Case c, auto&& setup) {
    setup(c.options, c.mods, c);
    out.push_back(std::move(c));
  };
  const auto none = [](ForwardOptions&, Mods&, Case&) {};
  switch (g) {
    case Group::shapes:  // no options: awkward sizes, dv != d, GQA / MQA
      add(fixed("1x1_d1", 1, 1, 1, 1, 1, 1, 1, 11), none);
      add(fixed("17x127_d17_b2_h2", 2, 17, 127, 2, 2, 17, 17, 12), none);
      add(fixed("127x17_d40", 1, 127, 17, 1, 1, 40, 40, 13), none);
      add(fixed("300x300_d64_h2", 1, 300, 300, 2, 2, 64, 64, 14), none);
      add(fixed("127x300_d80_dv40_b2", 2, 127, 300, 1, 1, 80, 40, 15), none);
      add(fixed("17x300_d128_gqa4over2", 1, 17, 300, 4, 2, 128, 128, 16), none);
      add(fixed("64x127_d256", 1, 64, 127, 1, 1, 256, 256, 17), none);
      add(fixed("300x17_d1_dv17_mqa4", 1, 300, 17, 4, 1, 1, 17, 18), none);
      add(fixed("1x300_d256_dv128_b2_mqa2", 2, 1, 300, 2, 1, 256, 128, 19), none);
      // Decode and short verify steps (K and V read in place; bf16 on pairs where the set
      // multiplies them so): odd key counts leave an odd last key tile.
      add(fixed("decode_1x127_d128_gqa4over2_b2", 2, 1, 127, 8, 2, 128, 128, 101), none);
      add(fixed("decode_1x1001_d80_dv64_gqa16", 1, 1, 1001, 16, 1, 80, 64, 102), none);
      add(fixed("verify_3x17_d64_gqa4", 1, 3, 17, 4, 1, 64, 64, 103), none);
      break;
    case Group::masks:
      add(fixed("causal_br_127x300_gqa4over2", 1, 127, 300, 4, 2, 64, 64, 21),
          [](ForwardOptions& o, Mods&, Case&) { o.causal = true; });
      add(fixed("causal_br_300x127_rows_without_keys", 1, 300, 127, 2, 2, 40, 40, 22),
          [](ForwardOptions& o, Mods&, Case&) { o.causal = true; });
      add(fixed("causal_tl_300x127", 1, 300, 127, 2, 2, 17, 17, 23), [](ForwardOptions& o, Mods&, Case&) {
        o.causal = true;
        o.alignment = MaskAlignment::top_left;
      });
      add(fixed("causal_tl_127x300_d64_dv80_mqa2", 1, 127, 300, 2, 1, 64, 80, 24),
          [](ForwardOptions& o, Mods&, Case&) {
            o.causal = true;
            o.alignment = MaskAlignment::top_left;
          });
      add(fixed("window_l32_r8_300x300", 1, 300, 300, 1, 1, 64, 64, 25), [](ForwardOptions& o, Mods&, Case&) {
        o.window_left = 32;
        o.window_right = 8;
      });
      add(fixed("window_left5_17x127_b2", 2, 17, 127, 2, 1, 128, 128, 26),
          [](ForwardOptions& o, Mods&, Case&) { o.window_left = 5; });
      add(fixed("window_right3_tl_127x17", 1, 127, 17, 2, 2, 40, 17, 27), [](ForwardOptions& o, Mods&, Case&) {
        o.window_right = 3;
        o.alignment = MaskAlignment::top_left;
      });
      add(fixed("causal_window_left20_300x300_mqa4", 1, 300, 300, 4, 1, 80, 80, 28),
          [](ForwardOptions& o, Mods&, Case&) {
            o.causal = true;
            o.window_left = 20;
          });
      break;
    case Group::score_mods:
      add(fixed("softcap3_127x127", 1, 127, 127, 2, 2, 64, 64, 31),
          [](ForwardOptions& o, Mods&, Case&) { o.softcap = 3.0f; });
      add(fixed("softcap30_causal_tl_300x127_gqa4over2", 1, 300, 127, 4, 2, 128, 128, 32),
          [](ForwardOptions& o, Mods&, Case&) {
            o.softcap = 30.0f;
            o.causal = true;
            o.alignment = MaskAlignment::top_left;
          });
      add(fixed("alibi_causal_127x300_mqa4", 1, 127, 300, 4, 1, 64, 64, 33), [](ForwardOptions& o, Mods& m, Case&) {
        o.causal = true;
        m.alibi = true;
      });
      add(fixed("alibi_per_sequence_17x127_b2", 2, 17, 127, 2, 2, 40, 40, 34),
          [](ForwardOptions&, Mods& m, Case&) { m.alibi_per_sequence = true; });
      add(fixed("sinks_127x127_gqa4over2", 1, 127, 127, 4, 2, 64, 64, 35),
          [](ForwardOptions&, Mods& m, Case&) { m.sinks = true; });
      add(fixed("sinks_causal_br_300x127_rows_without_keys", 1, 300, 127, 2, 2, 17, 17, 36),
          [](ForwardOptions& o, Mods& m, Case&) {
            o.causal = true;
            m.sinks = true;
          });
      add(fixed("bias_127x300_b2_mqa2", 2, 127, 300, 2, 1, 64, 64, 37),
          [](ForwardOptions&, Mods& m, Case&) { m.bias = true; });
      add(fixed("bias_broadcast_and_mask_127x127_d80_dv64", 1, 127, 127, 4, 2, 80, 64, 38),
          [](ForwardOptions&, Mods& m, Case&) {
            m.bias = m.bias_broadcast = true;
            m.mask = true;
          });
      add(fixed("mask_17x300_d128", 1, 17, 300, 2, 2, 128, 128, 39),
          [](ForwardOptions&, Mods& m, Case&) { m.mask = true; });
      add(fixed("scale0.5_300x127_d64", 1, 300, 127, 1, 1, 64, 64, 40),
          [](ForwardOptions& o, Mods&, Case&) { o.softmax_scale = 0.5f; });
      add(fixed("scale2_127x300_d17_mqa2", 1, 127, 300, 2, 1, 17, 17, 41),
          [](ForwardOptions& o, Mods&, Case&) { o.softmax_scale = 2.0f; });
      add(fixed("everything_127x300_b2_gqa4over2_d64_dv80", 2, 127, 300, 4, 2, 64, 80, 42),
          [](ForwardOptions& o, Mods& m, Case& c) {
            o.causal = true;
            o.window_left = 64;
            o.softcap = 20.0f;
            o.softmax_scale = 0.3f;
            m.bias = m.mask = m.alibi = m.sinks = true;
            c.budget_16x32 = true;
          });
      break;
    case Group::budgets:
      add(fixed("budget16rows_causal_300x300_d64_gqa4over2", 1, 300, 300, 4, 2, 64, 64, 51),
          [](ForwardOptions& o, Mods&, Case& c) {
            o.causal = true;
            c.budget_16x32 = true;
          });
      add(fixed("budget16rows_127x300_d128_dv64_b2", 2, 127, 300, 2, 2, 128, 64, 52),
          [](ForwardOptions&, Mods&, Case& c) { c.budget_16x32 = true; });
      add(fixed("budget16x32_300x127_d256", 1, 300, 127, 1, 1, 256, 256, 53),
          [](ForwardOptions&, Mods&, Case& c) { c.budget_16x32 = true; });
      add(fixed("budget16x32_window_17x300_d40", 1, 17, 300, 2, 1, 40, 40, 54),
          [](ForwardOptions& o, Mods&, Case& c) {
            c.budget_16x32 = true;
            o.window_left = 100;
            o.window_right = 0;
          });
      break;
    case Group::varlen:  // empty sequences: no queries, no keys (O = 0, LSE = -inf), both
      add(varlen("varlen_plain_gqa4over2", {17, 0, 40, 1, 127, 0}, {30, 12, 0, 1, 300, 0}, 4, 2, 64, 64, 61), none);
      add(varlen("varlen_causal_br_alibi_bias_sinks_dv17", {127, 17, 0, 64}, {17, 127, 5, 64}, 2, 1, 40, 17, 62),
          [](ForwardOptions& o, Mods& m, Case&) {
            o.causal = true;
            m.alibi_per_sequence = true;
            m.bias = true;
            m.sinks = true;
          });
      add(varlen("varlen_window_mask_tl_budget16rows", {300, 1, 33}, {300, 0, 127}, 2, 2, 80, 80, 63),
          [](ForwardOptions& o, Mods& m, Case& c) {
            o.window_left = 16;
            o.window_right = 16;
            o.alignment = MaskAlignment::top_left;
            c.budget_16x32 = true;
            m.mask = true;
          });
      add(varlen("varlen_softcap_scale2_causal_tl", {1, 127, 17}, {127, 1, 17}, 1, 1, 128, 128, 64),
          [](ForwardOptions& o, Mods&, Case& c) {
            o.causal = true;
            o.alignment = MaskAlignment::top_left;
            o.softcap = 5.0f;
            o.softmax_scale = 2.0f;
            c.budget_16x32 = true;
          });
      break;
  }
  return out;
}

// ---- One case: inputs, option buffers, kernel call, errors --------------------------------------

/// N(0, 1) values rounded to T, and their exact float copies.
template <storage_type T>
struct Rounded {
  std::vector<T> t;
  std::vector<float> f;
  Rounded(index_t n, std::uint64_t seed) : t(static_cast<std::size_t>(n)), f(static_cast<std::size_t>(n)) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = from_float<T>(normal(rng));
      f[i] = to_float(t[i]);
    }
  }
};

/// Max absolute errors against the reference of the kernel and of the naive attention.
struct Errors {
  Deviation kernel, naive;
};

void merge_into(Deviation& into, const Deviation& d, const std::string& where) {
  into.o = std::max(into.o, d.o);
  into.lse = std::max(into.lse, d.lse);
  if (into.problem.empty() && !d.problem.empty()) into.problem = where + ": " + d.problem;
}

/// The reference and the naive T attention of one set of float views, each against the
/// kernel's O (as floats) and LSE.
template <storage_type T>
Errors errors_of(const TensorView<const float>& q, const TensorView<const float>& k, const TensorView<const float>& v,
                 const reference::Options& ro, const TensorView<const float>& kernel_o, const LseView& kernel_lse) {
  const auto ref = reference::attention<float>(q, k, v, ro);
  const index_t B = q.shape[0], nq = q.shape[1], hq = q.shape[2], dv = v.shape[3];
  std::vector<float> naive_o(static_cast<std::size_t>(B * nq * hq * dv)),
      naive_lse(static_cast<std::size_t>(B * hq * nq));
  const TensorView<float> no = make_bshd(naive_o.data(), B, nq, hq, dv);
  const LseView nl = make_lse(naive_lse.data(), B, hq, nq);
  naive_same_precision<T>(q, k, v, ro, no, nl);
  return {compare_to_reference(ref, kernel_o, kernel_lse), compare_to_reference(ref, no, nl)};
}

/// One case for storage type T: inputs rounded to T (and float copies), the option buffers
/// ForwardOptions points into, and the kernel's outputs. Fixed-length cases use contiguous
/// [B, N, H, D] buffers; varlen ones packed [total, H, D] buffers with 2 spare query rows
/// (and 1 spare key row) that the call must leave alone.
template <storage_type T>
class Instance {
 public:
  static constexpr index_t spare_q_rows = 2;

  explicit Instance(const Case& c)
      : c_(c),
        rows_q_(c.varlen() ? c.total_q() + spare_q_rows : c.batch * c.seqlen_q),
        rows_k_(c.varlen() ? c.total_k() + 1 : c.batch * c.seqlen_k),
        q_(rows_q_ * c.heads_q * c.head_dim, 10 * c.seed + 1),
        k_(rows_k_ * c.heads_kv * c.head_dim, 10 * c.seed + 2),
        v_(rows_k_ * c.heads_kv * c.head_dim_v, 10 * c.seed + 3),
        o_(static_cast<std::size_t>(rows_q_ * c.heads_q * c.head_dim_v)),
        lse_(static_cast<std::size_t>(c.varlen() ? c.heads_q * rows_q_ : c.batch * c.heads_q * c.seqlen_q)),
        opts_(c.options) {
    if (c.varlen()) {
      cu_q_.assign(1, 0);
      cu_k_.assign(1, 0);
      for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
        cu_q_.push_back(cu_q_.back() + c.q_lens[b]);
        cu_k_.push_back(cu_k_.back() + c.k_lens[b]);
      }
    }
    if (c.budget_16x32)
      opts_.sram_budget_bytes = rows_budget_for<T>(16, c.head_dim, c.head_dim_v);
    const index_t B = c.batch, H = c.heads_q, nq = c.seqlen_q, nk = c.seqlen_k;  // nq, nk: the maxima for varlen
    std::mt19937_64 rng(10 * c.seed + 4);
    if (c.mods.bias) {
      const index_t bb = c.mods.bias_broadcast ? 1 : B, bh = c.mods.bias_broadcast ? 1 : H;
      bias_.resize(static_cast<std::size_t>(bb * bh * nq * nk));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& x : bias_) x = normal(rng);
      opts_.bias = {bias_.data(), {bb, bh, nq, nk}, {bh * nq * nk, nq * nk, nk, 1}};
    }
    if (c.mods.mask) {
      const auto n = static_cast<std::size_t>(H * nq * nk);
      mask_ = std::make_unique<bool[]>(n);
      std::bernoulli_distribution visible(0.7);
      for (std::size_t i = 0; i < n; ++i) mask_[i] = visible(rng);
      std::fill_n(mask_.get(), nk, false);  // query 0 of head 0 sees no key
      opts_.mask = {mask_.get(), {1, H, nq, nk}, {0, nq * nk, nk, 1}};
    }
    if (c.mods.alibi || c.mods.alibi_per_sequence) {
      slopes_.resize(static_cast<std::size_t>(c.mods.alibi_per_sequence ? B * H : H));
      std::uniform_real_distribution<float> u(0.02f, 0.5f);
      for (float& x : slopes_) x = u(rng);
      opts_.alibi_slopes = slopes_;
    }
    if (c.mods.sinks) {
      sinks_.resize(static_cast<std::size_t>(H));
      std::uniform_real_distribution<float> u(-1.0f, 3.0f);
      for (float& x : sinks_) x = u(rng);
      opts_.sinks = sinks_;
    }
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const ForwardOptions& options() const { return opts_; }
  const std::vector<T>& o() const { return o_; }
  const std::vector<float>& lse() const { return lse_; }

  TensorView<const T> q() const {
    return make_bshd<const T>(q_.t.data(), c_.batch, c_.seqlen_q, c_.heads_q, c_.head_dim);
  }
  TensorView<const T> k() const {
    return make_bshd<const T>(k_.t.data(), c_.batch, c_.seqlen_k, c_.heads_kv, c_.head_dim);
  }
  TensorView<const T> v() const {
    return make_bshd<const T>(v_.t.data(), c_.batch, c_.seqlen_k, c_.heads_kv, c_.head_dim_v);
  }

  /// Fills O and LSE with the sentinel, then runs the kernel under `exec` (counting HBM bytes into *io when given).
  void run_kernel(Execution exec = {}, IoCounts* io = nullptr) {
    std::fill(o_.begin(), o_.end(), from_float<T>(sentinel));
    std::fill(lse_.begin(), lse_.end(), sentinel);
    ForwardOptions opts = opts_;
    opts.execution = exec;
    opts.io_counts = io;
    const index_t hq = c_.heads_q, hkv = c_.heads_kv, d = c_.head_dim, dv = c_.head_dim_v;
    if (c_.varlen()) {
      forward_varlen(make_thd<const T>(q_.t.data(), rows_q_, hq, d), make_thd<const T>(k_.t.data(), rows_k_, hkv, d),
                     make_thd<const T>(v_.t.data(), rows_k_, hkv, dv), make_thd(o_.data(), rows_q_, hq, dv),
                     make_packed_lse(lse_.data(), hq, rows_q_),
                     VarlenSequences{cu_q_, cu_k_, c_.seqlen_q, c_.seqlen_k}, opts);
    } else {
      forward(q(), k(), v(), make_bshd(o_.data(), c_.batch, c_.seqlen_q, hq, dv),
              make_lse(lse_.data(), c_.batch, hq, c_.seqlen_q), opts);
    }
  }

  /// The last run's errors, and the naive T attention's, against the double reference (per
  /// sequence for varlen, where spare rows still holding the sentinel is also checked).
  Errors errors() {
    std::vector<float> of(o_.size());
    std::transform(o_.begin(), o_.end(), of.begin(), [](T x) { return to_float(x); });
    const index_t hq = c_.heads_q, hkv = c_.heads_kv, d = c_.head_dim, dv = c_.head_dim_v;
    const reference::Options ro = reference::Options::from(opts_);
    if (!c_.varlen()) {
      const index_t B = c_.batch, nq = c_.seqlen_q, nk = c_.seqlen_k;
      return errors_of<T>(make_bshd<const float>(q_.f.data(), B, nq, hq, d),
                          make_bshd<const float>(k_.f.data(), B, nk, hkv, d),
                          make_bshd<const float>(v_.f.data(), B, nk, hkv, dv),
                          ro, make_bshd<const float>(of.data(), B, nq, hq, dv), make_lse(lse_.data(), B, hq, nq));
    }
    Errors all;
    const auto q = make_thd<const float>(q_.f.data(), rows_q_, hq, d);
    const auto k = make_thd<const float>(k_.f.data(), rows_k_, hkv, d);
    const auto v = make_thd<const float>(v_.f.data(), rows_k_, hkv, dv);
    const auto o = make_thd<const float>(of.data(), rows_q_, hq, dv);
    for (index_t b = 0; b < c_.batch; ++b) {
      const auto ub = static_cast<std::size_t>(b);
      const index_t q0 = cu_q_[ub], nq = cu_q_[ub + 1] - q0, k0 = cu_k_[ub], nk = cu_k_[ub + 1] - k0;
      reference::Options rb = ro;
      rb.batch_index = b;
      const Errors e = errors_of<T>(reference::sequence_view(q, q0, nq), reference::sequence_view(k, k0, nk),
                                    reference::sequence_view(v, k0, nk), rb, reference::sequence_view(o, q0, nq),
                                    LseView{lse_.data() + q0, {1, hq, nq}, {0, rows_q_, 1}});
      const std::string where = "sequence " + std::to_string(b);
      merge_into(all.kernel, e.kernel, where);
      merge_into(all.naive, e.naive, where);
    }
    const T sentinel_t = from_float<T>(sentinel);
    std::size_t touched = 0;
    for (auto i = static_cast<std::size_t>(cu_q_.back() * hq * dv); i < o_.size(); ++i)
      touched += std::memcmp(&o_[i], &sentinel_t, sizeof(T)) != 0;
    for (index_t h = 0; h < hq; ++h)
      for (index_t r = cu_q_.back(); r < rows_q_; ++r)
        touched += lse_[static_cast<std::size_t>(h * rows_q_ + r)] != sentinel;
    if (touched && all.kernel.problem.empty())
      all.kernel.problem = std::to_string(touched) + " elements of O / LSE past the last sequence were written";
    return all;
  }

 private:
  Case c_;
  index_t rows_q_, rows_k_;
  Rounded<T> q_, k_, v_;
  std::vector<T> o_;
  std::vector<float> lse_;
  std::vector<std::int32_t> cu_q_, cu_k_;
  std::vector<float> bias_, slopes_, sinks_;
  std::unique_ptr<bool[]> mask_;
  ForwardOptions opts_;
};

// ---- The rule, and the figures --------------------------------------------------------------------

/// FlashAttention's bound on the kernel's error given the naive same-precision error.
double rule_bound(double naive_error) { return 2.0 * naive_error + 1e-5; }

struct Figures {
  int cases = 0, violations = 0;             // cases recorded, and those that broke the rule (or structure)
  std::vector<double> o_ratios, lse_ratios;  // kernel / naive max error, over cases whose naive error is not 0
  double kernel_o = 0, naive_o = 0, kernel_lse = 0, naive_lse = 0;
  std::string worst_o_case, worst_lse_case;
  double worst_o_ratio = 0, worst_lse_ratio = 0;

  void add(const std::string& name, const Errors& e) {
    ++cases;
    violations += !e.kernel.problem.empty() || e.kernel.o > rule_bound(e.naive.o) ||
                  e.kernel.lse > rule_bound(e.naive.lse);
    if (e.naive.o > 0) {
      const double r = e.kernel.o / e.naive.o;
      o_ratios.push_back(r);
      if (r > worst_o_ratio) worst_o_ratio = r, worst_o_case = name;
    }
    if (e.naive.lse > 0) {
      const double r = e.kernel.lse / e.naive.lse;
      lse_ratios.push_back(r);
      if (r > worst_lse_ratio) worst_lse_ratio = r, worst_lse_case = name;
    }
    kernel_o = std::max(kernel_o, e.kernel.o);
    naive_o = std::max(naive_o, e.naive.o);
    kernel_lse = std::max(kernel_lse, e.kernel.lse);
    naive_lse = std::max(naive_lse, e.naive.lse);
  }
};

template <storage_type T>
Figures& figures() {
  static Figures f;
  return f;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Runs every case of a group for T and checks the rule and the structure on each.
template <storage_type T>
void check_group(Group g) {
  for (const Case& c : cases_of(g)) {
    SCOPED_TRACE(std::string(type_name<T>()) + " case " + c.name);
    Instance<T> inst(c);
    ASSERT_NO_THROW(inst.run_kernel());
    const Errors e = inst.errors();
    EXPECT_EQ(e.kernel.problem, "");
    EXPECT_EQ(e.naive.problem, "") << "(the test's naive attention)";
    EXPECT_LE(e.kernel.o, rule_bound(e.naive.o)) << "O: kernel error " << e.kernel.o << ", naive " << e.naive.o;
    EXPECT_LE(e.kernel.lse, rule_bound(e.naive.lse))
        << "LSE: kernel error " << e.kernel.lse << ", naive " << e.naive.lse;
    figures<T>().add(c.name, e);
  }
}

// ---- Tests ------------------------------------------------------------------------------------------

template <class T>
class ForwardPrecision : public ::testing::Test {};

struct TypeNames {
  template <class T>
  static std::string GetName(int) {
    return type_name<T>();
  }
};

using StorageTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(ForwardPrecision, StorageTypes, TypeNames);

TYPED_TEST(ForwardPrecision, RuleOnAwkwardShapes) { check_group<TypeParam>(Group::shapes); }
TYPED_TEST(ForwardPrecision, RuleWithCausalAndWindowMasks) { check_group<TypeParam>(Group::masks); }
TYPED_TEST(ForwardPrecision, RuleWithScoreModifiersAndScales) { check_group<TypeParam>(Group::score_mods); }
TYPED_TEST(ForwardPrecision, RuleUnderSmallSramBudgets) { check_group<TypeParam>(Group::budgets); }
TYPED_TEST(ForwardPrecision, RuleOnVarlenBatchesWithEmptySequences) { check_group<TypeParam>(Group::varlen); }

// The rule is not too loose to fail: attentions with an option bug (causal alignment
// flipped, the bias or the sinks dropped, the last key dropped), computed like the naive
// one, break it on the same inputs; and for plain N(0, 1) problems the bound itself is
// small (a few ulps of T at 1).
TYPED_TEST(ForwardPrecision, RuleCatchesOptionBugs) {
  using T = TypeParam;
  Case c = fixed("teeth_127x17", 1, 127, 17, 2, 1, 40, 40, 71);
  c.options.causal = true;
  c.options.alignment = MaskAlignment::top_left;
  c.mods.bias = c.mods.sinks = true;
  Instance<T> inst(c);
  inst.run_kernel();
  const Errors good = inst.errors();
  ASSERT_EQ(good.kernel.problem, "");
  const double bound_o = rule_bound(good.naive.o), bound_lse = rule_bound(good.naive.lse);
  EXPECT_LE(good.kernel.o, bound_o);
  EXPECT_LE(good.kernel.lse, bound_lse);
  // The naive error is a few ulps of T at 1 (bf16: 2^-8, fp16: 2^-11): the rule is tight.
  const double ulp_at_1 = std::is_same_v<T, bf16> ? 0x1p-7 : 0x1p-10;
  EXPECT_LE(good.naive.o, 4 * ulp_at_1);

  const auto floats = [](const TensorView<const T>& t) {
    std::vector<float> f(static_cast<std::size_t>(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]));
    std::transform(t.data, t.data + f.size(), f.begin(), [](T x) { return to_float(x); });
    return f;
  };
  const std::vector<float> qf = floats(inst.q()), kf = floats(inst.k()), vf = floats(inst.v());
  const auto q = make_bshd<const float>(qf.data(), 1, 127, 2, 40);
  const auto k = make_bshd<const float>(kf.data(), 1, 17, 1, 40);
  const auto v = make_bshd<const float>(vf.data(), 1, 17, 1, 40);
  const reference::Options right = reference::Options::from(inst.options());
  const auto ref = reference::attention<float>(q, k, v, right);

  struct Bug {
    const char* what;
    reference::Options opt;
    index_t keys;
  };
  std::vector<Bug> bugs(4, Bug{"", right, 17});
  bugs[0].what = "causal alignment bottom-right instead of top-left";
  bugs[0].opt.alignment = MaskAlignment::bottom_right;
  bugs[1].what = "bias dropped";
  bugs[1].opt.bias = {};
  bugs[2].what = "sinks dropped";
  bugs[2].opt.sinks = {};
  bugs[3].what = "last key dropped";
  bugs[3].keys = 16;
  for (const Bug& bug : bugs) {
    std::vector<float> o(127 * 2 * 40), lse(2 * 127);
    const auto kb = make_bshd<const float>(kf.data(), 1, bug.keys, 1, 40);
    const auto vb = make_bshd<const float>(vf.data(), 1, bug.keys, 1, 40);
    naive_same_precision<T>(q, kb, vb, bug.opt, make_bshd(o.data(), 1, 127, 2, 40), make_lse(lse.data(), 1, 2, 127));
    const Deviation d = compare_to_reference(ref, make_bshd<const float>(o.data(), 1, 127, 2, 40),
                                             make_lse(lse.data(), 1, 2, 127));
    EXPECT_TRUE(!d.problem.empty() || d.o > bound_o || d.lse > bound_lse)
        << bug.what << " passes the rule: O error " << d.o << " (bound " << bound_o << "), LSE error " << d.lse
        << " (bound " << bound_lse << ")";
  }
}

// Every backend at 1, 2 and 3 threads gives the same bits as serial at 1 thread, fixed-length
// and varlen, with masks and score modifiers and a budget small enough for many tiles.
TYPED_TEST(ForwardPrecision, BitwiseIdenticalOnEveryBackendAndThreadCount) {
  using T = TypeParam;
  Case fixed_case = fixed("determinism_300x127_b2_gqa4over2_d80_dv64", 2, 300, 127, 4, 2, 80, 64, 81);
  fixed_case.options.causal = true;
  fixed_case.options.alignment = MaskAlignment::top_left;
  fixed_case.options.window_left = 50;
  fixed_case.options.softcap = 10.0f;
  fixed_case.mods.alibi = fixed_case.mods.bias = fixed_case.mods.sinks = true;
  fixed_case.budget_16x32 = true;
  Case varlen_case = varlen("determinism_varlen", {127, 0, 300, 17}, {300, 5, 127, 0}, 4, 1, 64, 64, 82);
  varlen_case.options.causal = true;
  varlen_case.mods.mask = true;
  varlen_case.budget_16x32 = true;
  for (const Case& c : {fixed_case, varlen_case}) {
    SCOPED_TRACE(c.name);
    Instance<T> inst(c);
    inst.run_kernel({Backend::serial, 1});
    const std::vector<T> o = inst.o();
    const std::vector<float> lse = inst.lse();
    const Errors e = inst.errors();  // the baseline itself is right
    EXPECT_EQ(e.kernel.problem, "");
    EXPECT_LE(e.kernel.o, rule_bound(e.naive.o));
    EXPECT_LE(e.kernel.lse, rule_bound(e.naive.lse));
    for (Backend b : compiled_backends())
      for (int threads : {1, 2, 3}) {
        inst.run_kernel({b, threads});
        EXPECT_EQ(std::memcmp(inst.o().data(), o.data(), o.size() * sizeof(T)), 0)
            << "O differs on " << to_string(b) << " at " << threads << " threads";
        EXPECT_EQ(std::memcmp(inst.lse().data(), lse.data(), lse.size() * sizeof(float)), 0)
            << "LSE differs on " << to_string(b) << " at " << threads << " threads";
      }
  }
}

// HBM bytes are counted in the stored type: O in 2-byte elements (LSE in float), and Q, K, V
// reads of 2 bytes per element: exactly half of the same call in float when both get the
// same number of work items (one query tile; fp16 always, as its tiles are float tiles
// with float's plan), and the analytic count of each one's own plan otherwise (bf16 pair
// tiles are half as big, so a small budget fits more rows: fewer query tiles, fewer K/V
// re-reads, less than half of float's reads).
TYPED_TEST(ForwardPrecision, IoCountsInTwoByteElements) {
  using T = TypeParam;
  const index_t B = 2, hq = 4, hkv = 2, d = 64, dv = 80, nk = 300, group = hq / hkv;
  const Execution serial{Backend::serial, 1};
  int halved = 0;
  for (index_t nq : {17, 300})
    for (std::size_t budget : {std::size_t{0}, std::max(rows_budget(8, d, dv), rows_budget_for<T>(8, d, dv))}) {
      SCOPED_TRACE("nq " + std::to_string(nq) + ", budget " + std::to_string(budget));
      Case c = fixed("io", B, nq, nk, hq, hkv, d, dv, 91);
      c.options.sram_budget_bytes = budget;
      c.options.execution = serial;
      Instance<T> half(c);
      Instance<float> full(c);
      IoCounts io_half{7, 7}, io_full{7, 7};
      half.run_kernel(serial, &io_half);
      full.run_kernel(serial, &io_full);
      const auto N = static_cast<std::uint64_t>(B * nq * hq);
      EXPECT_EQ(io_half.bytes_written, N * static_cast<std::uint64_t>(dv) * 2 + N * 4);
      EXPECT_EQ(io_full.bytes_written, N * static_cast<std::uint64_t>(dv) * 4 + N * 4);

      // Non-causal: every query head's Q read once, K and V once per (query tile, head chunk).
      const auto expected_read = [&](const TilePlan& plan, std::uint64_t element_bytes) {
        const index_t items = plan.query_tiles(nq) * plan.head_chunks(group);
        return static_cast<std::uint64_t>(B * hkv * (group * nq * d + items * nk * (d + dv))) * element_bytes;
      };
      const TilePlan plan_half = plan_forward(half.q(), half.k(), half.v(), half.options()).tiles();
      const TilePlan plan_full = plan_forward(full.q(), full.k(), full.v(), full.options()).tiles();
      EXPECT_EQ(io_half.bytes_read, expected_read(plan_half, 2));
      EXPECT_EQ(io_full.bytes_read, expected_read(plan_full, 4));
      const index_t items_half = plan_half.query_tiles(nq) * plan_half.head_chunks(group);
      const index_t items_full = plan_full.query_tiles(nq) * plan_full.head_chunks(group);
      if ((nq == 17 && budget == 0) || std::is_same_v<T, fp16>) {  // one query tile each; fp16: float's tiles
        EXPECT_EQ(items_half, items_full);
      }
      if (items_half == items_full) {
        EXPECT_EQ(2 * io_half.bytes_read, io_full.bytes_read);
        ++halved;
      } else {  // each its own plan's count (above): the key tiles differ (bf16 panels: 128 or 512
                // keys, float 64), so under one budget either may hold more rows
        std::printf("[ io ] %s nq %lld budget %zu: %lld work items per kv stream (tiles %lld x %lld) vs float's %lld "
                    "(%lld x %lld): reads %llu vs float's %llu bytes\n",
                    type_name<T>(), static_cast<long long>(nq), budget, static_cast<long long>(items_half),
                    static_cast<long long>(plan_half.query_tile_rows), static_cast<long long>(plan_half.key_tile_rows),
                    static_cast<long long>(items_full), static_cast<long long>(plan_full.query_tile_rows),
                    static_cast<long long>(plan_full.key_tile_rows),
                    static_cast<unsigned long long>(io_half.bytes_read),
                    static_cast<unsigned long long>(io_full.bytes_read));
      }
    }
  EXPECT_GE(halved, 2);  // at least the one-query-tile calls
}

// THE PRINTING TEST: the figures docs quote. Prints, per type, the max errors of the kernel
// and of the naive same-precision attention over the cases of the Rule* tests above, and the
// distribution (median, max) of the per-case ratio kernel / naive max error (over the cases
// whose naive error is not 0). Run alone (--gtest_filter), it runs those cases itself first.
// It fails if any recorded case broke the rule, so figures are never quoted from a failing run.
TYPED_TEST(ForwardPrecision, PrintsErrorFiguresForDocs) {
  using T = TypeParam;
  if (figures<T>().cases == 0)
    for (Group g : all_groups) check_group<T>(g);
  const Figures& f = figures<T>();
  ASSERT_GT(f.cases, 0);
  EXPECT_EQ(f.violations, 0) << "cases over 2 x naive + 1e-5";
  const char* name = type_name<T>();
  std::printf("[ precision ] %s: %d problems; FlashAttention's rule: kernel max |error| <= 2 x naive %s attention's + "
              "1e-5 (%d over)\n",
              name, f.cases, name, f.violations);
  std::printf("[ precision ] %s O:   max |error| kernel %.3g, naive %.3g; kernel / naive, %zu problems: median %.3f, "
              "max %.3f (%s)\n",
              name, f.kernel_o, f.naive_o, f.o_ratios.size(), median(f.o_ratios), f.worst_o_ratio,
              f.worst_o_case.c_str());
  std::printf("[ precision ] %s LSE: max |error| kernel %.3g, naive %.3g; kernel / naive, %zu problems: median %.3g, "
              "max %.3g (%s)\n",
              name, f.kernel_lse, f.naive_lse, f.lse_ratios.size(), median(f.lse_ratios), f.worst_lse_ratio,
              f.worst_lse_case.c_str());
}

}  // namespace
}  // namespace tileattn::test
