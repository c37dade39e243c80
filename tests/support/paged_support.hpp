// tests/support/paged_support.hpp: a random paged batch for the paged-kernel tests: per
// sequence K/V in contiguous buffers (for the reference and the contiguous forward) and
// the same rows scattered over a page pool through a shuffled block table, with every
// unused pool row and table entry poisoned (NaN rows, out-of-pool page ids) so that a stray
// read shows up; Q, O and LSE with sentinels.
#pragma once

#include <algorithm>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::test {

struct PagedShape {
  std::vector<index_t> k_lens;  // cache_seqlens
  index_t q_len = 1;            // per sequence (fixed-length queries)
  index_t heads_q = 8, heads_kv = 2, head_dim = 64, head_dim_v = 0;
  index_t page_size = 16;
  index_t spare_pages = 3;      // poisoned pages no sequence uses
  index_t dv() const { return head_dim_v ? head_dim_v : head_dim; }
  index_t batch() const { return static_cast<index_t>(k_lens.size()); }
};

template <class T>
struct PagedBatch {
  PagedShape shape;
  index_t max_pages = 0, num_pages = 0, max_k = 0;
  std::vector<T> q, o;
  std::vector<T, LineAlignedAllocator<T>> k_pool, v_pool;  // as KvCache lays them out
  std::vector<std::vector<T>> k_seq, v_seq;  // [1, k_len, heads_kv, d] per sequence
  std::vector<float> lse;
  std::vector<std::int32_t> table, seqlens;

  explicit PagedBatch(const PagedShape& s, std::uint64_t seed = 1) : shape(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const index_t B = s.batch(), P = s.page_size, hkv = s.heads_kv;
    for (index_t len : s.k_lens) {
      max_pages = std::max(max_pages, (len + P - 1) / P);
      max_k = std::max(max_k, len);
      num_pages += (len + P - 1) / P;
    }
    max_pages += 1;  // a padding column, poisoned
    num_pages += s.spare_pages;
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    k_pool.assign(static_cast<std::size_t>(num_pages * P * hkv * s.head_dim), T(nan));
    v_pool.assign(static_cast<std::size_t>(num_pages * P * hkv * s.dv()), T(nan));
    table.assign(static_cast<std::size_t>(B * max_pages), std::int32_t{1} << 30);
    std::size_t next = 0;
    for (index_t b = 0; b < B; ++b) {
      const index_t len = s.k_lens[static_cast<std::size_t>(b)];
      seqlens.push_back(static_cast<std::int32_t>(len));
      auto& kb = k_seq.emplace_back(static_cast<std::size_t>(len * hkv * s.head_dim));
      auto& vb = v_seq.emplace_back(static_cast<std::size_t>(len * hkv * s.dv()));
      for (auto& x : kb) x = T(normal(rng));
      for (auto& x : vb) x = T(normal(rng));
      for (index_t j = 0; j * P < len; ++j) table[static_cast<std::size_t>(b * max_pages + j)] = order[next++];
      for (index_t r = 0; r < len; ++r) {
        const index_t page = table[static_cast<std::size_t>(b * max_pages + r / P)];
        std::copy_n(&kb[static_cast<std::size_t>(r * hkv * s.head_dim)], hkv * s.head_dim,
                    &k_pool[static_cast<std::size_t>((page * P + r % P) * hkv * s.head_dim)]);
        std::copy_n(&vb[static_cast<std::size_t>(r * hkv * s.dv())], hkv * s.dv(),
                    &v_pool[static_cast<std::size_t>((page * P + r % P) * hkv * s.dv())]);
      }
    }
    q.resize(static_cast<std::size_t>(B * s.q_len * s.heads_q * s.head_dim));
    for (auto& x : q) x = T(normal(rng));
    reset_outputs();
  }

  void reset_outputs() {
    o.assign(static_cast<std::size_t>(shape.batch() * shape.q_len * shape.heads_q * shape.dv()), T(sentinel));
    lse.assign(static_cast<std::size_t>(shape.batch() * shape.heads_q * shape.q_len), sentinel);
  }

  TensorView<const T> q_view() const { return make_bshd(q.data(), shape.batch(), shape.q_len, shape.heads_q, shape.head_dim); }
  TensorView<T> o_view() { return make_bshd(o.data(), shape.batch(), shape.q_len, shape.heads_q, shape.dv()); }
  LseView lse_view() { return make_lse(lse.data(), shape.batch(), shape.heads_q, shape.q_len); }
  TensorView<const T> k_cache() const { return make_bshd(k_pool.data(), num_pages, shape.page_size, shape.heads_kv, shape.head_dim); }
  TensorView<const T> v_cache() const { return make_bshd(v_pool.data(), num_pages, shape.page_size, shape.heads_kv, shape.dv()); }
  BlockTableView block_table() const { return make_block_table(table.data(), shape.batch(), max_pages); }

  void run(const PagedOptions& options = {}) {
    forward_paged(q_view(), k_cache(), v_cache(), block_table(), seqlens, o_view(), lse_view(), options);
  }

  /// Sequence b's queries, K and V as [1, len, heads, dim] views.
  TensorView<const T> q_of(index_t b) const {
    const index_t n = shape.q_len * shape.heads_q * shape.head_dim;
    return make_bshd(q.data() + b * n, 1, shape.q_len, shape.heads_q, shape.head_dim);
  }
  TensorView<const T> k_of(index_t b) const {
    return make_bshd(k_seq[static_cast<std::size_t>(b)].data(), 1, shape.k_lens[static_cast<std::size_t>(b)], shape.heads_kv, shape.head_dim);
  }
  TensorView<const T> v_of(index_t b) const {
    return make_bshd(v_seq[static_cast<std::size_t>(b)].data(), 1, shape.k_lens[static_cast<std::size_t>(b)], shape.heads_kv, shape.dv());
  }

  /// O and LSE of sequence b as floats, [1, q_len, heads, dv] / [1, heads, q_len].
  std::vector<float> o_of(index_t b) const {
    const index_t n = shape.q_len * shape.heads_q * shape.dv();
    std::vector<float> out(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = to_float(o[static_cast<std::size_t>(b * n + i)]);
    return out;
  }
  std::vector<float> lse_of(index_t b) const {
    const index_t n = shape.heads_q * shape.q_len;
    return {lse.begin() + b * n, lse.begin() + (b + 1) * n};
  }

  /// The largest deviation of every sequence from the double reference (float batches).
  Deviation against_reference(const ForwardOptions& options) const {
    Deviation worst;
    for (index_t b = 0; b < shape.batch(); ++b) {
      reference::Options ref_opt = reference::Options::from(options);
      ref_opt.batch_index = b;
      const auto ref = reference::attention(q_of(b), k_of(b), v_of(b), ref_opt);
      auto o_b = o_of(b);
      auto lse_b = lse_of(b);
      const Deviation d = compare_to_reference(ref, make_bshd<const float>(o_b.data(), 1, shape.q_len, shape.heads_q, shape.dv()),
                                               make_lse(lse_b.data(), 1, shape.heads_q, shape.q_len));
      worst.o = std::max(worst.o, d.o);
      worst.lse = std::max(worst.lse, d.lse);
      if (worst.problem.empty() && !d.problem.empty()) worst.problem = "sequence " + std::to_string(b) + ": " + d.problem;
    }
    return worst;
  }
};

/// A batch's deviation from the reference is within `tol` on O and LSE, with no structural
/// problem (Deviation::problem).
inline void expect_close(const Deviation& d, double tol = forward_o_tolerance) {
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  EXPECT_LE(d.o, tol);
  EXPECT_LE(d.lse, tol);
}

/// Runs `run(opt)` on `batch` once, then on every compiled backend at 1, 2, 3 and 7 threads,
/// and expects O and LSE bitwise the same each time (`what` tells the failures apart).
template <class Batch, class Run>
void expect_same_bits_on_every_backend(Batch& batch, PagedOptions opt, Run&& run, const std::string& what = "") {
  batch.reset_outputs();
  run(opt);
  const auto first = batch.o;
  const auto first_lse = batch.lse;
  for (Backend backend : compiled_backends())
    for (int threads : {1, 2, 3, 7}) {
      opt.execution = {backend, threads};
      batch.reset_outputs();
      run(opt);
      EXPECT_TRUE(bitwise_equal(batch.o, first) && bitwise_equal(batch.lse, first_lse))
          << to_string(backend) << " x " << threads << what;
    }
}

}  // namespace tileattn::test
