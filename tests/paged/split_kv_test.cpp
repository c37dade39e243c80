// tests/paged/split_kv_test.cpp: split-KV (forward_paged with num_splits != 1) at every score
// magnitude. A split row must equal the unsplit one within rounding, and both the double
// reference, at scores of 1e3, 1e5, 1e7 and 1e30, and for an Inf in Q under a softcap of
// 1e30; in fp32, bf16 and over an int8 cache; at several num_splits and the automatic choice.
//
// The inputs make every row's softmax a tie: Q and K are small integers (exact in every
// storage type, so the dot products are exact), each key is one of four "palette" vectors,
// and each query row scores the palettes 4, 8, 12 and 16 (times the scale). At these
// magnitudes a row is then the plain average of V over the keys of its top palette, which
// the chunks of a split sequence hold in different numbers: the merge must weigh each
// chunk by its count. (Partial states that keep one float LSE per row lost that count to
// the LSE's rounding: 0.4% weight error at 1e5, equal weights at 1e30.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/test_support.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::test {
namespace {

constexpr index_t heads_q = 4, heads_kv = 2, head_dim = 16, page_size = 16;
constexpr index_t palettes = 4;   // key vectors 4 e_0 .. 4 e_3 in dims 0..3
constexpr index_t sign_dim = 4;   // +-1 in every key: where the Inf rows put their Inf
constexpr float int8_v_scale = 1.0f / 32;

template <class S>
S stored_as(float x) {
  if constexpr (std::is_same_v<S, std::int8_t>) return static_cast<std::int8_t>(x);
  else return from_float<S>(x);
}

/// A value of V as it is stored: N(0, 1) rounded to S (int8: a multiple of 1/32).
template <class S>
float stored_value(float x) {
  if constexpr (std::is_same_v<S, std::int8_t>) return std::clamp(std::round(x / int8_v_scale), -127.0f, 127.0f);
  else return to_float(from_float<S>(x));
}

/// A paged batch whose scores tie in groups (file comment). Q in T, K/V pools in KV (int8:
/// K at scale 1, V at 1/32); the float copies hold exactly the stored values.
template <class T, class KV>
struct TiedScoreBatch {
  std::vector<index_t> lens;
  index_t q_len, max_pages = 0, num_pages = 0;
  std::vector<float> qf;                       // [B, q_len, heads_q, head_dim]
  std::vector<std::vector<float>> kf, vf;      // per sequence [len, heads_kv, head_dim]
  std::vector<T> q;
  std::vector<KV> k_pool, v_pool;
  std::vector<std::int32_t> table, seqlens;
  float k_scale = 1.0f, v_scale = std::is_same_v<KV, std::int8_t> ? int8_v_scale : 1.0f;

  /// inf_rows: every query of heads 0 and 3 has +Inf at sign_dim.
  TiedScoreBatch(std::vector<index_t> k_lens, index_t ql, bool inf_rows, std::uint64_t seed)
      : lens(std::move(k_lens)), q_len(ql) {
    std::mt19937_64 rng(seed);
    for (index_t len : lens) {
      max_pages = std::max(max_pages, (len + page_size - 1) / page_size);
      num_pages += (len + page_size - 1) / page_size;
    }
    for (index_t b = 0; b < batch(); ++b) add_sequence(b, rng);
    fill_pools(rng);
    fill_queries(inf_rows, rng);
  }

  index_t batch() const { return static_cast<index_t>(lens.size()); }

  /// Keys in the first 40% of a sequence are palettes 0 and 1 only, so chunks hold a row's
  /// top palette in very different numbers.
  void add_sequence(index_t b, std::mt19937_64& rng) {
    const index_t len = lens[static_cast<std::size_t>(b)];
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> small(-4, 4), sign(0, 1), early(0, 1), late(0, palettes - 1);
    auto& k = kf.emplace_back(static_cast<std::size_t>(len * heads_kv * head_dim), 0.0f);
    auto& v = vf.emplace_back(static_cast<std::size_t>(len * heads_kv * head_dim), 0.0f);
    for (index_t j = 0; j < len; ++j)
      for (index_t h = 0; h < heads_kv; ++h) {
        float* key = &k[static_cast<std::size_t>((j * heads_kv + h) * head_dim)];
        key[10 * j < 4 * len ? early(rng) : late(rng)] = 4.0f;
        key[sign_dim] = sign(rng) ? 1.0f : -1.0f;
        for (index_t c = sign_dim + 1; c < head_dim; ++c) key[c] = static_cast<float>(small(rng));
        for (index_t c = 0; c < head_dim; ++c)
          v[static_cast<std::size_t>((j * heads_kv + h) * head_dim + c)] = stored_value<KV>(normal(rng)) * v_scale;
      }
    seqlens.push_back(static_cast<std::int32_t>(len));
  }

  /// Pages in shuffled order; the rows past a sequence's end and the spare table entries
  /// are poisoned.
  void fill_pools(std::mt19937_64& rng) {
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const std::size_t row = heads_kv * head_dim;
    k_pool.assign(static_cast<std::size_t>(num_pages * page_size) * row, stored_as<KV>(std::is_same_v<KV, std::int8_t> ? 127.0f : NAN));
    v_pool = k_pool;
    table.assign(static_cast<std::size_t>(batch() * max_pages), std::int32_t{1} << 30);
    std::size_t next = 0;
    for (index_t b = 0; b < batch(); ++b) {
      for (index_t j = 0; j * page_size < lens[static_cast<std::size_t>(b)]; ++j)
        table[static_cast<std::size_t>(b * max_pages + j)] = order[next++];
      for (index_t r = 0; r < lens[static_cast<std::size_t>(b)]; ++r) {
        const auto page = static_cast<std::size_t>(table[static_cast<std::size_t>(b * max_pages + r / page_size)]);
        const std::size_t at = (page * page_size + static_cast<std::size_t>(r % page_size)) * row;
        for (std::size_t c = 0; c < row; ++c) {
          k_pool[at + c] = stored_as<KV>(kf[static_cast<std::size_t>(b)][static_cast<std::size_t>(r) * row + c] / k_scale);
          v_pool[at + c] = stored_as<KV>(vf[static_cast<std::size_t>(b)][static_cast<std::size_t>(r) * row + c] / v_scale);
        }
      }
    }
  }

  /// Each query row scores palette p as 4 x (a permutation of 1..4)[p]; dims past sign_dim are 0.
  void fill_queries(bool inf_rows, std::mt19937_64& rng) {
    qf.assign(static_cast<std::size_t>(batch() * q_len * heads_q * head_dim), 0.0f);
    for (index_t row = 0; row < batch() * q_len * heads_q; ++row) {
      float* query = &qf[static_cast<std::size_t>(row * head_dim)];
      std::iota(query, query + palettes, 1.0f);
      std::shuffle(query, query + palettes, rng);
      const index_t head = row % heads_q;
      if (inf_rows && (head == 0 || head == heads_q - 1)) query[sign_dim] = std::numeric_limits<float>::infinity();
    }
    for (float x : qf) q.push_back(from_float<T>(x));
  }

  PagedOptions options(index_t splits) const {
    PagedOptions opt;
    opt.causal = true;
    opt.num_splits = splits;
    if constexpr (std::is_same_v<KV, std::int8_t>) {
      opt.k_scale = per_tensor_scale(&k_scale);
      opt.v_scale = per_tensor_scale(&v_scale);
    }
    return opt;
  }

  TensorView<const T> q_view() const { return make_bshd(q.data(), batch(), q_len, heads_q, head_dim); }
  TensorView<const KV> pool(const std::vector<KV>& p) const {
    return make_bshd(p.data(), num_pages, page_size, heads_kv, head_dim);
  }

  /// The keys per chunk forward_paged takes with these options (0: no split).
  index_t keys_per_split(const PagedOptions& opt) const {
    std::vector<T> o(q.size());
    std::vector<float> lse(static_cast<std::size_t>(batch() * heads_q * q_len));
    return plan_forward_paged(q_view(), pool(k_pool), pool(v_pool), make_block_table(table.data(), batch(), max_pages),
                      seqlens, make_bshd(o.data(), batch(), q_len, heads_q, head_dim),
                      make_lse(lse.data(), batch(), heads_q, q_len), opt)
        .keys_per_split();
  }

  struct Result {
    std::vector<float> o, lse;  // [B, q_len, heads_q, head_dim] and [B, heads_q, q_len]
  };
  Result run(const PagedOptions& opt) const {
    std::vector<T> o(q.size(), from_float<T>(sentinel));
    Result r{{}, std::vector<float>(static_cast<std::size_t>(batch() * heads_q * q_len), sentinel)};
    forward_paged(q_view(), pool(k_pool), pool(v_pool), make_block_table(table.data(), batch(), max_pages), seqlens,
                  make_bshd(o.data(), batch(), q_len, heads_q, head_dim), make_lse(r.lse.data(), batch(), heads_q, q_len),
                  opt);
    for (const T& x : o) r.o.push_back(to_float(x));
    return r;
  }

  /// The double reference over the stored values, as one Result per batch.
  std::vector<reference::AttentionResult> reference(const PagedOptions& opt) const {
    std::vector<reference::AttentionResult> out;
    for (index_t b = 0; b < batch(); ++b) {
      const index_t len = lens[static_cast<std::size_t>(b)];
      reference::Options ref = reference::Options::from(opt);
      out.push_back(reference::attention(
          make_bshd<const float>(qf.data() + b * q_len * heads_q * head_dim, 1, q_len, heads_q, head_dim),
          make_bshd<const float>(kf[static_cast<std::size_t>(b)].data(), 1, len, heads_kv, head_dim),
          make_bshd<const float>(vf[static_cast<std::size_t>(b)].data(), 1, len, heads_kv, head_dim), ref));
    }
    return out;
  }
};

/// How close two results must be: |O - want| <= o_relative |want| + o_absolute, and
/// |LSE - want| <= lse_relative |want| + lse_absolute.
struct Bound {
  double o_relative, o_absolute, lse_relative, lse_absolute;
};

/// The first element of `got` outside `bound` around `want` (by index), or "".
std::string first_outside(const std::vector<float>& got, const std::vector<double>& want, double relative,
                          double absolute, const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(error <= relative * std::abs(want[i]) + absolute))
      return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]) + " (error " + std::to_string(error) + ")";
  }
  return "";
}

template <class Result>
std::string outside(const Result& got, const std::vector<double>& want_o, const std::vector<double>& want_lse,
                    const Bound& bound) {
  const std::string o = first_outside(got.o, want_o, bound.o_relative, bound.o_absolute, "O");
  return o.empty() ? first_outside(got.lse, want_lse, bound.lse_relative, bound.lse_absolute, "LSE") : o;
}

std::vector<double> widened(const std::vector<float>& x) { return {x.begin(), x.end()}; }

/// Concatenates the per-sequence references into the batch's layout (fixed q_len).
void join(const std::vector<reference::AttentionResult>& refs, std::vector<double>& o, std::vector<double>& lse) {
  for (const auto& r : refs) {
    o.insert(o.end(), r.o.begin(), r.o.end());
    lse.insert(lse.end(), r.lse.begin(), r.lse.end());
  }
}

/// Bounds for Q in T. Split against unsplit: fp32 rounding (bf16: the two may round O to
/// neighbouring bf16 values, 2^-7 relative). Against the reference: the forward's 2e-5
/// (bf16: plus half a bf16 ulp); the LSE relative to its size, whose float holds it to
/// 2^-24 and whose log2-unit shift carries a few such roundings (softmax_scale x log2(e)).
template <class T>
Bound split_bound() {
  if constexpr (std::is_same_v<T, bf16>) return {0x1p-7, 1e-6, 0x1p-22, 2e-6};
  else return {0.0, 1e-6, 0x1p-22, 2e-6};  // measured: 1.2e-7
}
template <class T>
Bound reference_bound() {
  if constexpr (std::is_same_v<T, bf16>) return {0x1p-8, forward_o_tolerance, 0x1p-20, forward_lse_tolerance};
  else return {0.0, forward_o_tolerance, 0x1p-20, forward_lse_tolerance};
}

/// Runs unsplit and at num_splits 0 (automatic), 2, 3, 5 and 8 with `scale` and `softcap`
/// (0: none), checking each against the reference and every split run against the unsplit one.
template <class T, class KV>
void check_splits(const TiedScoreBatch<T, KV>& batch, float scale, float softcap) {
  const auto with = [&](index_t splits) {
    PagedOptions opt = batch.options(splits);
    if (scale > 0) opt.softmax_scale = scale;
    opt.softcap = softcap;
    return opt;
  };
  std::vector<double> ref_o, ref_lse;
  join(batch.reference(with(1)), ref_o, ref_lse);
  const auto unsplit = batch.run(with(1));
  EXPECT_EQ(outside(unsplit, ref_o, ref_lse, reference_bound<T>()), "") << "unsplit against the reference";
  for (index_t splits : {0, 2, 3, 5, 8}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    ASSERT_GT(batch.keys_per_split(with(splits)), 0) << "the sequences must really split";
    const auto split = batch.run(with(splits));
    EXPECT_EQ(outside(split, widened(unsplit.o), widened(unsplit.lse), split_bound<T>()), "") << "split against unsplit";
    EXPECT_EQ(outside(split, ref_o, ref_lse, reference_bound<T>()), "") << "split against the reference";
  }
}

/// Every magnitude, decode (q_len 1, K/V read in place) and a verify step of 12 tokens
/// (packed tiles).
template <class T, class KV>
void check_magnitudes() {
  for (index_t q_len : {1, 12}) {
    const TiedScoreBatch<T, KV> batch({2000, 1100}, q_len, false, 17 + static_cast<std::uint64_t>(q_len));
    for (float magnitude : {1e3f, 1e5f, 1e7f, 1e30f}) {
      SCOPED_TRACE("q_len " + std::to_string(q_len) + ", scores up to " + std::to_string(magnitude));
      check_splits(batch, magnitude / 16, 0.0f);  // the top palette scores 16 x scale
    }
  }
}

/// Heads 0 and 3 have an Inf in Q: under a softcap of 1e30 their scores are +-1e30, tied
/// at the top for every key with a +1 at sign_dim. Heads 1 and 2 are finite, with scores up
/// to 1e5 (ties too: with scores near 1, bf16's rounded P would need a looser bound).
template <class T, class KV>
void check_inf_under_softcap() {
  for (index_t q_len : {1, 12}) {
    SCOPED_TRACE("q_len " + std::to_string(q_len));
    const TiedScoreBatch<T, KV> batch({2000, 1100}, q_len, true, 29 + static_cast<std::uint64_t>(q_len));
    check_splits(batch, 1e5f / 16, 1e30f);
  }
}

TEST(SplitKvAtLargeScores, Fp32EqualsUnsplitAtScoresOf1e3To1e30) { check_magnitudes<float, float>(); }
TEST(SplitKvAtLargeScores, Bf16EqualsUnsplitAtScoresOf1e3To1e30) { check_magnitudes<bf16, bf16>(); }
TEST(SplitKvAtLargeScores, Int8CacheEqualsUnsplitAtScoresOf1e3To1e30) { check_magnitudes<float, std::int8_t>(); }
TEST(SplitKvAtLargeScores, Fp32InfInQUnderSoftcap1e30) { check_inf_under_softcap<float, float>(); }
TEST(SplitKvAtLargeScores, Bf16InfInQUnderSoftcap1e30) { check_inf_under_softcap<bf16, bf16>(); }
TEST(SplitKvAtLargeScores, Int8CacheInfInQUnderSoftcap1e30) { check_inf_under_softcap<float, std::int8_t>(); }

}  // namespace
}  // namespace tileattn::test
