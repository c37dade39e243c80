// tests/variants/batch_invariance_test.cpp: ForwardOptions::batch_invariant. One sequence,
// X, run alone and inside batches of other sequences (longer, shorter, many), must give the
// same bits: its O and LSE in forward_varlen and forward_paged (decode, which split-KV cuts
// into chunks, and a causal verify step), and its dQ, dK, dV in backward_varlen. Without the
// option a paged batch changes X's fp32 bits (split-KV chunks by the batch's total keys), so
// the comparison can fail; and X alone in the mode stays within the reference's bound.
// (In the varlen batches below the default mode
// happens to keep X's bits too: the forward's key tile is 64 keys unless the longest
// sequence is shorter, and the backward groups its sums alike for any key tile. Split-KV is
// where the default depends on the batch, and where the check without the option fails.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/paged_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::test {
namespace {

constexpr index_t heads_q = 4, heads_kv = 2, head_dim = 40;

/// One sequence's Q, K, V and dO (packed rows [len, heads, head_dim]), drawn from its seed:
/// the same values in every batch it joins.
template <class T>
struct Sequence {
  index_t q_len, k_len;
  std::vector<T> q, k, v, dout;
  Sequence(index_t nq, index_t nk, std::uint64_t seed) : q_len(nq), k_len(nk) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    const auto fill = [&](std::vector<T>& x, index_t rows, index_t heads) {
      x.resize(static_cast<std::size_t>(rows * heads * head_dim));
      for (T& e : x) e = from_float<T>(normal(rng));
    };
    fill(q, nq, heads_q);
    fill(k, nk, heads_kv);
    fill(v, nk, heads_kv);
    fill(dout, nq, heads_q);
  }
};

/// What a varlen call gave one sequence: O, LSE, and (backward) dQ, dK, dV, as raw floats.
struct Bits {
  std::vector<float> o, lse, dq, dk, dv;
  bool operator==(const Bits& b) const {
    return bitwise_equal(o, b.o) && bitwise_equal(lse, b.lse) && bitwise_equal(dq, b.dq) && bitwise_equal(dk, b.dk) &&
           bitwise_equal(dv, b.dv);
  }
};

template <class T>
std::vector<float> floats(const std::vector<T>& x, std::size_t begin, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = to_float(x[begin + i]);
  return out;
}

/// Packs `batch` into varlen tensors, runs forward_varlen (and backward_varlen when
/// `backward`) and returns sequence `which`'s results.
template <class T>
Bits run_varlen(const std::vector<const Sequence<T>*>& batch, std::size_t which, BackwardOptions options,
                bool backward) {
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  std::vector<T> q, k, v, dout;
  index_t max_q = 0, max_k = 0;
  for (const Sequence<T>* s : batch) {
    q.insert(q.end(), s->q.begin(), s->q.end());
    k.insert(k.end(), s->k.begin(), s->k.end());
    v.insert(v.end(), s->v.begin(), s->v.end());
    dout.insert(dout.end(), s->dout.begin(), s->dout.end());
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(s->q_len));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(s->k_len));
    max_q = std::max(max_q, s->q_len);
    max_k = std::max(max_k, s->k_len);
  }
  const index_t tq = cu_q.back(), tk = cu_k.back();
  std::vector<T> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(static_cast<std::size_t>(heads_q * tq));
  const VarlenSequences seqs{cu_q, cu_k, max_q, max_k};
  forward_varlen(make_thd<const T>(q.data(), tq, heads_q, head_dim), make_thd<const T>(k.data(), tk, heads_kv, head_dim),
                 make_thd<const T>(v.data(), tk, heads_kv, head_dim), make_thd(o.data(), tq, heads_q, head_dim),
                 make_packed_lse(lse.data(), heads_q, tq), seqs, options);
  if (backward)
    backward_varlen(make_thd<const T>(q.data(), tq, heads_q, head_dim), make_thd<const T>(k.data(), tk, heads_kv, head_dim),
                    make_thd<const T>(v.data(), tk, heads_kv, head_dim), make_thd<const T>(o.data(), tq, heads_q, head_dim),
                    SavedPackedLseView{lse.data(), {heads_q, tq}, {tq, 1}},
                    make_thd<const T>(dout.data(), tq, heads_q, head_dim), make_thd(dq.data(), tq, heads_q, head_dim),
                    make_thd(dk.data(), tk, heads_kv, head_dim), make_thd(dv.data(), tk, heads_kv, head_dim), seqs, options);
  const Sequence<T>& x = *batch[which];
  const auto q0 = static_cast<std::size_t>(cu_q[which]), k0 = static_cast<std::size_t>(cu_k[which]);
  const auto q_n = static_cast<std::size_t>(x.q_len * heads_q * head_dim);
  const auto k_n = static_cast<std::size_t>(x.k_len * heads_kv * head_dim);
  Bits bits{floats(o, q0 * heads_q * head_dim, q_n), {}, {}, {}, {}};
  for (index_t h = 0; h < heads_q; ++h)
    bits.lse.insert(bits.lse.end(), lse.begin() + h * tq + cu_q[which], lse.begin() + h * tq + cu_q[which + 1]);
  if (backward) {
    bits.dq = floats(dq, q0 * heads_q * head_dim, q_n);
    bits.dk = floats(dk, k0 * heads_kv * head_dim, k_n);
    bits.dv = floats(dv, k0 * heads_kv * head_dim, k_n);
  }
  return bits;
}

template <class T>
class BatchInvariance : public ::testing::Test {};
using Types = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(BatchInvariance, Types);

TYPED_TEST(BatchInvariance, VarlenForwardAndBackwardGiveASequenceTheSameBitsInAnyBatch) {
  using T = TypeParam;
  const Sequence<T> x(37, 50, 1), tiny(1, 1, 2), odd(17, 17, 3), long_keys(129, 700, 4), long_queries(300, 90, 5);
  const std::vector<std::vector<const Sequence<T>*>> batches = {
      {&x, &long_keys}, {&tiny, &x, &long_queries}, {&odd, &long_keys, &x, &tiny, &long_queries}};
  for (bool causal : {false, true}) {
    BackwardOptions options;
    options.causal = causal;
    options.batch_invariant = true;
    const Bits alone = run_varlen<T>({&x}, 0, options, true);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      std::size_t which = 0;
      while (batches[b][which] != &x) ++which;
      for (int threads : {1, 2}) {
        options.execution.num_threads = threads;
        EXPECT_TRUE(run_varlen<T>(batches[b], which, options, true) == alone)
            << "batch " << b << ", " << threads << " threads, causal " << causal;
      }
      options.execution.num_threads = 0;
    }
  }
}

TEST(BatchInvariance, AloneWithinTheReferenceBound) {
  const Sequence<float> x(37, 50, 1);
  ForwardOptions options;
  options.causal = true;
  options.batch_invariant = true;
  std::vector<float> o(x.q.size()), lse(static_cast<std::size_t>(heads_q * x.q_len));
  const auto q = make_bshd<const float>(x.q.data(), 1, x.q_len, heads_q, head_dim);
  const auto k = make_bshd<const float>(x.k.data(), 1, x.k_len, heads_kv, head_dim);
  const auto v = make_bshd<const float>(x.v.data(), 1, x.k_len, heads_kv, head_dim);
  forward(q, k, v, make_bshd(o.data(), 1, x.q_len, heads_q, head_dim), make_lse(lse.data(), 1, heads_q, x.q_len), options);
  const Deviation d = compare_to_reference(reference::attention(q, k, v, reference::Options::from(options)),
                                           make_bshd<const float>(o.data(), 1, x.q_len, heads_q, head_dim),
                                           make_lse(lse.data(), 1, heads_q, x.q_len));
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  EXPECT_LT(d.o, forward_o_tolerance);
  EXPECT_LT(d.lse, forward_lse_tolerance);
}

/// forward_paged of sequence 0 of `batch` on its own (its block table row, its length)
/// against the whole batch: O and LSE of sequence 0 bitwise.
template <class T>
void expect_paged_invariant(PagedBatch<T>& batch, PagedOptions options, bool want_same, const std::string& what) {
  batch.reset_outputs();
  batch.run(options);
  const std::vector<float> o_batch = batch.o_of(0), lse_batch = batch.lse_of(0);
  batch.reset_outputs();
  const PagedShape& s = batch.shape;
  forward_paged(make_bshd<const T>(batch.q.data(), 1, s.q_len, s.heads_q, s.head_dim), batch.k_cache(),
                batch.v_cache(), make_block_table(batch.table.data(), 1, batch.max_pages),
                std::span<const std::int32_t>(batch.seqlens.data(), 1),
                make_bshd(batch.o.data(), 1, s.q_len, s.heads_q, s.dv()), make_lse(batch.lse.data(), 1, s.heads_q, s.q_len),
                options);
  const bool same = bitwise_equal(batch.o_of(0), o_batch) && bitwise_equal(batch.lse_of(0), lse_batch);
  EXPECT_EQ(same, want_same) << what;
}

TYPED_TEST(BatchInvariance, PagedDecodeAndVerifyGiveASequenceTheSameBitsInAnyBatch) {
  using T = TypeParam;
  // X: 3000 keys, which split-KV cuts into chunks alone and in every batch below.
  const std::vector<std::vector<index_t>> batches = {{3000, 40000}, {3000, 1, 17}, {3000, 3000, 3000, 3000, 3000}};
  for (index_t q_len : {1, 4}) {
    for (std::size_t b = 0; b < batches.size(); ++b) {
      PagedBatch<T> batch(PagedShape{batches[b], q_len, heads_q, heads_kv, 64, 0, 16}, 7);
      PagedOptions options;
      options.causal = q_len > 1;
      options.batch_invariant = true;
      for (int threads : {1, 2}) {
        options.execution.num_threads = threads;
        expect_paged_invariant(batch, options, true,
                               "batch " + std::to_string(b) + ", q_len " + std::to_string(q_len) + ", " +
                                   std::to_string(threads) + " threads");
      }
      if (b == 0 && std::is_same_v<T, float>) {  // 40000 more keys: split-KV cuts X into other chunks (bf16 O may round it away)
        options.batch_invariant = false;
        expect_paged_invariant(batch, options, false, "without batch_invariant, q_len " + std::to_string(q_len));
      }
    }
  }
}

TEST(BatchInvariance, NumSplitsAboveOneIsRejected) {
  PagedBatch<float> batch(PagedShape{{100, 3}, 1, heads_q, heads_kv, 32, 0, 16}, 3);
  PagedOptions options;
  options.batch_invariant = true;
  options.num_splits = 4;
  try {
    batch.run(options);
    ADD_FAILURE() << "num_splits = 4 with batch_invariant was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.parameter(), "num_splits");
  }
  EXPECT_TRUE(all_equal(batch.lse, sentinel));
  options.num_splits = 1;  // never split: invariant too
  EXPECT_NO_THROW(batch.run(options));
}

}  // namespace
}  // namespace tileattn::test
