// tests/paged/rotary_test.cpp: rotary embedding (RotaryOptions, ops/rotary.hpp) fused into the
// forward's Q load (forward, forward_varlen, forward_paged, forward_paged_varlen) and into the
// cache writes' K (KvCache::write / append, write_kv_slots): against the double-precision
// reference attending with Q and K rotated first (both layouts, rotary_dim < head_dim, odd
// head dims, awkward lengths, vLLM's strided cos_sin_cache), bitwise against the unfused
// sequence (apply_rotary, then the call without rotary), bf16 within FlashAttention's rule (2x
// a naive bf16 implementation's error), int8 and fp8 caches rotated before quantization, the
// same bits for every backend, thread count and budget; every bad rotary argument throws
// invalid_argument naming it, with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/naive_same_precision.hpp"
#include "support/test_support.hpp"

namespace tileattn::test {
namespace {

// ---- Tables, inputs and the reference rotation ------------------------------------------

/// RoPE tables [rows, half] (Llama's base 10000; any values would do), as two arrays or in
/// vLLM's cos_sin_cache layout (one [rows, 2 half] buffer, a row's cos then its sin: strided
/// views).
struct Tables {
  index_t rows = 0, half = 0;
  bool fused = false;
  std::vector<float> cos, sin;  // fused: both in cos

  RotaryOptions options(bool interleaved) const {
    const index_t ld = fused ? 2 * half : half;
    const float* s = fused ? cos.data() + half : sin.data();
    return {{cos.data(), {rows, half}, {ld, 1}}, {s, {rows, half}, {ld, 1}}, interleaved};
  }
};

Tables make_tables(index_t rows, index_t half, bool fused = false) {
  Tables t{rows, half, fused, {}, {}};
  const auto n = static_cast<std::size_t>(rows * half);
  t.cos.resize(fused ? 2 * n : n);
  t.sin.resize(fused ? 0 : n);
  for (index_t p = 0; p < rows; ++p)
    for (index_t c = 0; c < half; ++c) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(c) / static_cast<double>(half));
      const auto at = static_cast<std::size_t>(p * (fused ? 2 * half : half) + c);
      t.cos[at] = static_cast<float>(std::cos(angle));
      (fused ? t.cos[at + static_cast<std::size_t>(half)] : t.sin[at]) = static_cast<float>(std::sin(angle));
    }
  return t;
}

/// n N(0, 1) values rounded to T (never zero in practice).
template <class T>
std::vector<T> normal_values(index_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> out(static_cast<std::size_t>(n));
  for (T& x : out) x = from_float<T>(normal(rng));
  return out;
}

template <class T>
std::vector<float> as_floats(const std::vector<T>& x) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Contiguous rows [n, heads, dim] rotated in double, row i at position(i): the reference's
/// rotation (written out from the definition, pair by pair), each value rounded once to float.
template <class Position>
std::vector<float> rotated(const std::vector<float>& x, index_t n, index_t heads, index_t dim, const RotaryOptions& r,
                           Position position) {
  std::vector<float> out = x;
  const index_t half = r.cos.shape[1];
  for (index_t i = 0; i < n; ++i)
    for (index_t h = 0; h < heads; ++h)
      for (index_t c = 0; c < half; ++c) {
        const auto base = static_cast<std::size_t>((i * heads + h) * dim);
        const auto a = base + static_cast<std::size_t>(r.interleaved ? 2 * c : c);
        const auto b = base + static_cast<std::size_t>(r.interleaved ? 2 * c + 1 : c + half);
        const double x1 = x[a], x2 = x[b], cs = r.cos(position(i), c), sn = r.sin(position(i), c);
        out[a] = static_cast<float>(x1 * cs - x2 * sn);
        out[b] = static_cast<float>(x1 * sn + x2 * cs);
      }
  return out;
}

/// Rows [n, heads, dim] over a contiguous buffer.
template <class T>
StridedView<T, 3> rows_of(T* data, index_t n, index_t heads, index_t dim) {
  return {data, {n, heads, dim}, {heads * dim, dim, 1}};
}

std::vector<std::int64_t> iota_positions(index_t n, index_t first, index_t period = 0) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = first + (period ? i % period : i);
  return p;
}

void expect_close(const Deviation& d, double tol = forward_o_tolerance) {
  EXPECT_TRUE(d.problem.empty()) << d.problem;
  EXPECT_LE(d.o, tol);
  EXPECT_LE(d.lse, tol);
}

/// The parameter() of the invalid_argument f throws ("" when it does not).
template <class F>
std::string thrown_parameter(F&& f) {
  try {
    f();
  } catch (const invalid_argument& e) {
    return e.parameter();
  }
  return "";
}

// ---- The arithmetic -----------------------------------------------------------------------

TEST(RotaryMath, RotatesThePairsOfEachLayoutAndPassesTheRestThrough) {
  const Tables t = make_tables(40, 3);
  for (bool interleaved : {false, true}) {
    const RotaryOptions r = t.options(interleaved);
    std::vector<float> x = as_floats(normal_values<float>(11, 3));  // head_dim 11, rotary_dim 6
    std::vector<float> row = x;
    ops::rotate_row(r, row.data(), 37);
    const std::vector<float> want = rotated(x, 1, 1, 11, r, [](index_t) { return index_t{37}; });
    EXPECT_TRUE(same_bits(row, want)) << "interleaved " << interleaved;
    for (std::size_t c = 6; c < 11; ++c) EXPECT_EQ(row[c], x[c]);
    // Position 0 (cos 1, sin 0) changes nothing; the pairs are where each layout says.
    std::vector<float> at0 = x;
    ops::rotate_row(r, at0.data(), 0);
    EXPECT_TRUE(same_bits(at0, x));
  }
  std::vector<float> y{1.0f, 0.0f, 0.0f, 1.0f};  // NeoX pairs (y0, y2), (y1, y3) at angle 1 (c = 0)
  const Tables one = make_tables(2, 2);
  ops::rotate_row(one.options(false), y.data(), 1);
  EXPECT_NEAR(y[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(y[2], std::sin(1.0), 1e-7);
}

// ---- The contiguous forward ---------------------------------------------------------------

struct ForwardCase {
  index_t batch, nq, nk, hq, hkv, d, half;
  bool interleaved, causal, strided_tables;
  int alignment;  // 0 bottom-right, 1 top-left, 2 diagonal_offset 5
};

ForwardOptions with_alignment(ForwardOptions o, int alignment) {
  if (alignment == 1) o.alignment = MaskAlignment::top_left;
  if (alignment == 2) o.diagonal_offset = 5;
  return o;
}

TEST(RotaryForward, MatchesRotateThenAttendAndTheUnfusedCallBitwise) {
  const ForwardCase cases[] = {
      {2, 1, 17, 4, 2, 64, 32, false, true, false, 0},     // decode, the whole head rotated
      {1, 17, 127, 4, 1, 72, 16, true, true, true, 0},     // partial, interleaved, cos_sin_cache
      {2, 127, 127, 2, 2, 17, 8, false, false, false, 0},  // odd head_dim, not causal
      {1, 300, 300, 8, 2, 128, 64, true, true, false, 0},  // several query and key tiles
      {1, 17, 33, 2, 1, 32, 16, false, true, false, 1},    // top-left: positions i
      {2, 9, 20, 2, 2, 24, 4, true, false, true, 2},       // diagonal_offset: positions i + 5
  };
  for (const ForwardCase& c : cases) {
    SCOPED_TRACE("nq " + std::to_string(c.nq) + " nk " + std::to_string(c.nk) + " d " + std::to_string(c.d));
    const auto q = normal_values<float>(c.batch * c.nq * c.hq * c.d, 1 + c.nq);
    const auto k = normal_values<float>(c.batch * c.nk * c.hkv * c.d, 2 + c.nk);
    const auto v = normal_values<float>(c.batch * c.nk * c.hkv * c.d, 3 + c.d);
    const Tables t = make_tables(std::max(c.nk, c.nq + 5) + 3, c.half, c.strided_tables);
    ForwardOptions opt = with_alignment({}, c.alignment);
    opt.causal = c.causal;
    const index_t offset = opt.diagonal(c.nq, c.nk);
    const auto position = [&](index_t row) { return row % c.nq + offset; };  // row of [batch * nq]
    std::vector<float> o(static_cast<std::size_t>(c.batch * c.nq * c.hq * c.d)), lse(static_cast<std::size_t>(c.batch * c.hq * c.nq));
    std::vector<float> o2 = o, lse2 = lse;
    const auto kv = [&](const std::vector<float>& x) { return make_bshd(x.data(), c.batch, c.nk, c.hkv, c.d); };
    // Unfused: Q rotated by apply_rotary, then the forward without rotary.
    std::vector<float> q_rot = q;
    std::vector<std::int64_t> positions(static_cast<std::size_t>(c.batch * c.nq));
    for (index_t r = 0; r < c.batch * c.nq; ++r) positions[static_cast<std::size_t>(r)] = position(r);
    apply_rotary(rows_of(q_rot.data(), c.batch * c.nq, c.hq, c.d), positions, t.options(c.interleaved));
    forward(make_bshd(q_rot.data(), c.batch, c.nq, c.hq, c.d), kv(k), kv(v), make_bshd(o2.data(), c.batch, c.nq, c.hq, c.d),
            make_lse(lse2.data(), c.batch, c.hq, c.nq), opt);
    opt.rotary = t.options(c.interleaved);
    forward(make_bshd(q.data(), c.batch, c.nq, c.hq, c.d), kv(k), kv(v), make_bshd(o.data(), c.batch, c.nq, c.hq, c.d),
            make_lse(lse.data(), c.batch, c.hq, c.nq), opt);
    EXPECT_TRUE(bitwise_equal(o, o2));
    EXPECT_TRUE(bitwise_equal(lse, lse2));
    const auto q_ref = rotated(q, c.batch * c.nq, c.hq, c.d, opt.rotary, position);
    const auto ref = reference::attention<float>(make_bshd(q_ref.data(), c.batch, c.nq, c.hq, c.d), kv(k), kv(v),
                                                 reference::Options::from(opt));
    expect_close(compare_to_reference(ref, make_bshd<const float>(o.data(), c.batch, c.nq, c.hq, c.d),
                                      make_lse(lse.data(), c.batch, c.hq, c.nq)));
  }
}

TEST(RotaryForward, VarlenRotatesEachSequenceAtItsOwnPositions) {
  const std::vector<std::int32_t> q_lens{1, 17, 0, 5}, k_lens{17, 40, 3, 5};
  const index_t hq = 4, hkv = 2, d = 40, half = 12;
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    cu_q.push_back(cu_q.back() + q_lens[b]);
    cu_k.push_back(cu_k.back() + k_lens[b]);
  }
  const index_t tq = cu_q.back(), tk = cu_k.back();
  const auto q = normal_values<float>(tq * hq * d, 5), k = normal_values<float>(tk * hkv * d, 6),
             v = normal_values<float>(tk * hkv * d, 7);
  std::vector<std::int64_t> positions;  // query i of sequence b: i + k_len - q_len
  for (std::size_t b = 0; b < q_lens.size(); ++b)
    for (index_t i = 0; i < q_lens[b]; ++i) positions.push_back(i + k_lens[b] - q_lens[b]);
  const Tables t = make_tables(40, half);
  ForwardOptions opt;
  opt.causal = true;
  const VarlenSequences seqs{cu_q, cu_k, 17, 40};
  std::vector<float> o(static_cast<std::size_t>(tq * hq * d)), o2 = o;
  std::vector<float> q_rot = q;
  apply_rotary(rows_of(q_rot.data(), tq, hq, d), positions, t.options(false));
  forward_varlen(make_thd<const float>(q_rot.data(), tq, hq, d), make_thd(k.data(), tk, hkv, d), make_thd(v.data(), tk, hkv, d),
                 make_thd(o2.data(), tq, hq, d), PackedLseView{}, seqs, opt);
  opt.rotary = t.options(false);
  forward_varlen(make_thd(q.data(), tq, hq, d), make_thd(k.data(), tk, hkv, d), make_thd(v.data(), tk, hkv, d),
                 make_thd(o.data(), tq, hq, d), PackedLseView{}, seqs, opt);
  EXPECT_TRUE(bitwise_equal(o, o2));
  const auto q_ref = rotated(q, tq, hq, d, opt.rotary, [&](index_t r) { return positions[static_cast<std::size_t>(r)]; });
  for (std::size_t b = 0; b < q_lens.size(); ++b) {
    const auto ref = reference::attention<float>(reference::sequence_view(make_thd<const float>(q_ref.data(), tq, hq, d), cu_q[b], q_lens[b]),
                                                 reference::sequence_view(make_thd<const float>(k.data(), tk, hkv, d), cu_k[b], k_lens[b]),
                                                 reference::sequence_view(make_thd<const float>(v.data(), tk, hkv, d), cu_k[b], k_lens[b]),
                                                 reference::Options::from(opt));
    expect_close(compare_to_reference(ref, reference::sequence_view(make_thd<const float>(o.data(), tq, hq, d), cu_q[b], q_lens[b]), {}));
  }
}

/// bf16: the fused forward's error against the double reference (Q rotated in double from
/// its bf16 values) at most 2x that of a naive bf16 attention on Q rotated and rounded to bf16
/// (FlashAttention's rule, as forward_precision_test.cpp applies it).
TEST(RotaryForward, Bf16WithinTwiceTheNaiveError) {
  struct Case { index_t nq, nk, d, half; bool interleaved; };
  for (const Case& c : {Case{17, 127, 64, 32, false}, Case{1, 300, 72, 16, true}, Case{127, 127, 128, 64, false}}) {
    SCOPED_TRACE("nq " + std::to_string(c.nq) + " d " + std::to_string(c.d));
    const index_t hq = 4, hkv = 2;
    const auto q = normal_values<bf16>(c.nq * hq * c.d, 11), k = normal_values<bf16>(c.nk * hkv * c.d, 12),
               v = normal_values<bf16>(c.nk * hkv * c.d, 13);
    const Tables t = make_tables(c.nk, c.half);
    ForwardOptions opt;
    opt.causal = true;
    opt.rotary = t.options(c.interleaved);
    std::vector<bf16> o(static_cast<std::size_t>(c.nq * hq * c.d));
    std::vector<float> lse(static_cast<std::size_t>(hq * c.nq));
    forward(make_bshd(q.data(), 1, c.nq, hq, c.d), make_bshd(k.data(), 1, c.nk, hkv, c.d), make_bshd(v.data(), 1, c.nk, hkv, c.d),
            make_bshd(o.data(), 1, c.nq, hq, c.d), make_lse(lse.data(), 1, hq, c.nq), opt);
    const auto at = [&](index_t i) { return i + c.nk - c.nq; };
    const auto qf = as_floats(q), kf = as_floats(k), vf = as_floats(v), of = as_floats(o);
    const auto q_ref = rotated(qf, c.nq, hq, c.d, opt.rotary, at);
    std::vector<bf16> q_naive = q;  // rotated and rounded as a bf16 implementation stores it
    apply_rotary(rows_of(q_naive.data(), c.nq, hq, c.d), iota_positions(c.nq, c.nk - c.nq), opt.rotary);
    const auto q_naive_f = as_floats(q_naive);
    const auto view = [&](const std::vector<float>& x, index_t n, index_t h) { return make_bshd(x.data(), 1, n, h, c.d); };
    const reference::Options ro = reference::Options::from(opt);
    const auto ref = reference::attention<float>(view(q_ref, c.nq, hq), view(kf, c.nk, hkv), view(vf, c.nk, hkv), ro);
    std::vector<float> naive_o(of.size()), naive_lse(lse.size());
    naive_same_precision<bf16>(view(q_naive_f, c.nq, hq), view(kf, c.nk, hkv), view(vf, c.nk, hkv), ro,
                               make_bshd(naive_o.data(), 1, c.nq, hq, c.d), make_lse(naive_lse.data(), 1, hq, c.nq));
    const Deviation kernel = compare_to_reference(ref, view(of, c.nq, hq), make_lse(lse.data(), 1, hq, c.nq));
    const Deviation naive = compare_to_reference(ref, view(naive_o, c.nq, hq), make_lse(naive_lse.data(), 1, hq, c.nq));
    EXPECT_TRUE(kernel.problem.empty()) << kernel.problem;
    EXPECT_LE(kernel.o, 2.0 * naive.o + 1e-5) << "naive " << naive.o;
    EXPECT_LE(kernel.lse, 2.0 * naive.lse + 1e-5) << "naive " << naive.lse;
  }
}

// ---- The paged cache ----------------------------------------------------------------------

/// Sequences of the given lengths in a one-layer KvCache<T> (heads_kv 2, head_dim d): each
/// sequence's prompt appended at once, its last `steps` tokens written one decode step at a
/// time, with `rotary` (or unrotated when its tables are null); K and V as given, in float.
template <class T>
struct CachedBatch {
  std::vector<index_t> lens;
  index_t hkv = 2, d = 0;
  KvCache<T> cache;
  std::vector<SequenceId> ids;
  std::vector<std::vector<T>> k, v;  // per sequence, [len, hkv, d]

  CachedBatch(std::vector<index_t> lengths, index_t dim, index_t page_size, index_t steps, const RotaryOptions& rotary,
              std::uint64_t seed)
      : lens(std::move(lengths)), d(dim), cache(config(lens, dim, page_size)) {
    for (std::size_t b = 0; b < lens.size(); ++b) {
      const index_t len = lens[b], prompt = std::max<index_t>(len - steps, 0);
      k.push_back(normal_values<T>(len * hkv * d, seed + 2 * b));
      v.push_back(normal_values<T>(len * hkv * d, seed + 2 * b + 1));
      const SequenceId id = ids.emplace_back(cache.create());
      cache.append(id, TensorView<const T>{k[b].data(), {1, prompt, hkv, d}, {0, hkv * d, d, 1}},
                   TensorView<const T>{v[b].data(), {1, prompt, hkv, d}, {0, hkv * d, d, 1}}, rotary);
      for (index_t i = prompt; i < len; ++i) {
        cache.extend(id, 1);
        cache.write(0, id, rows_of<const T>(k[b].data() + i * hkv * d, 1, hkv, d),
                    rows_of<const T>(v[b].data() + i * hkv * d, 1, hkv, d), rotary);
      }
    }
  }
  static KvCacheConfig config(const std::vector<index_t>& lens, index_t d, index_t page_size) {
    index_t pages = 1;
    for (index_t len : lens) pages += (len + page_size - 1) / page_size + 1;
    return {.num_layers = 1, .num_pages = pages, .page_size = page_size, .heads_kv = 2, .head_dim = d};
  }
};

TEST(RotaryPaged, CacheWritesAndForwardPagedMatchRotateThenAttend) {
  const std::vector<index_t> lens{1, 17, 127, 300};
  const index_t hq = 8, hkv = 2;
  for (index_t page_size : {16, 3})
    for (bool interleaved : {false, true})
      for (index_t d : {64, 40}) {
        const index_t half = d == 64 ? 32 : 8;  // whole head, and partial
        SCOPED_TRACE("page_size " + std::to_string(page_size) + " interleaved " + std::to_string(interleaved) + " d " +
                     std::to_string(d));
        const Tables t = make_tables(310, half, /*fused=*/interleaved);  // both table layouts too
        const RotaryOptions r = t.options(interleaved);
        CachedBatch<float> fused(lens, d, page_size, 3, r, 100 + static_cast<std::uint64_t>(d));
        CachedBatch<float> plain(lens, d, page_size, 3, {}, 100 + static_cast<std::uint64_t>(d));  // same values
        const index_t B = static_cast<index_t>(lens.size());
        const auto q = normal_values<float>(B * hq * d, 9);
        const auto tables = fused.cache.batch(fused.ids);
        const auto plain_tables = plain.cache.batch(plain.ids);
        std::vector<float> q_rot = q;  // unfused: K and Q rotated by apply_rotary
        std::vector<std::int64_t> q_pos;
        for (index_t len : lens) q_pos.push_back(len - 1);
        apply_rotary(rows_of(q_rot.data(), B, hq, d), q_pos, r);
        for (std::size_t b = 0; b < lens.size(); ++b) {
          std::vector<float> k_rot = plain.k[b];
          apply_rotary(rows_of(k_rot.data(), lens[b], hkv, d), iota_positions(lens[b], 0), r);
          plain.cache.write(0, plain.ids[b], 0, rows_of<const float>(k_rot.data(), lens[b], hkv, d),
                            rows_of<const float>(plain.v[b].data(), lens[b], hkv, d));
        }
        for (index_t splits : {0, 1, 3}) {
          PagedOptions opt;
          opt.num_splits = splits;
          opt.causal = true;
          std::vector<float> o(static_cast<std::size_t>(B * hq * d)), o2 = o, lse(static_cast<std::size_t>(B * hq));
          forward_paged(make_bshd<const float>(q_rot.data(), B, 1, hq, d), plain.cache.k_pages(0), plain.cache.v_pages(0),
                        plain_tables.block_table_view(), plain_tables.seqlens(), make_bshd(o2.data(), B, 1, hq, d), opt);
          opt.rotary = r;
          forward_paged(make_bshd<const float>(q.data(), B, 1, hq, d), fused.cache.k_pages(0), fused.cache.v_pages(0),
                        tables.block_table_view(), tables.seqlens(), make_bshd(o.data(), B, 1, hq, d),
                        make_lse(lse.data(), B, hq, 1), opt);
          EXPECT_TRUE(bitwise_equal(o, o2)) << "num_splits " << splits;
          for (index_t b = 0; b < B; ++b) {
            const index_t len = lens[static_cast<std::size_t>(b)];
            const std::vector<float> qb(q.begin() + b * hq * d, q.begin() + (b + 1) * hq * d);
            const auto q_ref = rotated(qb, 1, hq, d, r, [&](index_t) { return len - 1; });
            const auto k_ref = rotated(fused.k[static_cast<std::size_t>(b)], len, hkv, d, r, [](index_t j) { return j; });
            const auto ref = reference::attention<float>(make_bshd(q_ref.data(), 1, 1, hq, d), make_bshd(k_ref.data(), 1, len, hkv, d),
                                                         make_bshd(fused.v[static_cast<std::size_t>(b)].data(), 1, len, hkv, d),
                                                         reference::Options::from(opt));
            expect_close(compare_to_reference(ref, make_bshd<const float>(o.data() + b * hq * d, 1, 1, hq, d),
                                              make_lse(lse.data() + b * hq, 1, hq, 1)));
          }
        }
      }
}

/// Verify steps of different lengths (forward_paged_varlen): query i of sequence b at
/// position i + cache_seqlens[b] - q_len[b]; bf16 cache and queries (bf16 pair tiles where
/// the CPU has them), bitwise as the unfused sequence at two SRAM budgets, for every backend
/// and thread count.
TEST(RotaryPaged, VarlenBf16BitwiseAsUnfusedForEveryBackendAndThreadCount) {
  const std::vector<index_t> lens{5, 17, 127, 1000};
  const std::vector<std::int32_t> q_lens{1, 4, 5, 3};
  const index_t hq = 8, hkv = 2, d = 64;
  const Tables t = make_tables(1000, 24);
  const RotaryOptions r = t.options(true);
  CachedBatch<bf16> fused(lens, d, 16, 5, r, 7);
  CachedBatch<bf16> plain(lens, d, 16, 5, {}, 7);
  std::vector<std::int32_t> cu{0};
  std::vector<std::int64_t> q_pos;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    cu.push_back(cu.back() + q_lens[b]);
    for (index_t i = 0; i < q_lens[b]; ++i) q_pos.push_back(i + lens[b] - q_lens[b]);
    std::vector<bf16> k_rot = plain.k[b];
    apply_rotary(rows_of(k_rot.data(), lens[b], hkv, d), iota_positions(lens[b], 0), r);
    plain.cache.write(0, plain.ids[b], 0, rows_of<const bf16>(k_rot.data(), lens[b], hkv, d),
                      rows_of<const bf16>(plain.v[b].data(), lens[b], hkv, d));
  }
  const index_t total = cu.back();
  const auto q = normal_values<bf16>(total * hq * d, 21);
  std::vector<bf16> q_rot = q;
  apply_rotary(rows_of(q_rot.data(), total, hq, d), q_pos, r);
  const auto tables = fused.cache.batch(fused.ids);
  const auto plain_tables = plain.cache.batch(plain.ids);
  for (std::size_t budget : {std::size_t{0}, rows_budget_for<bf16>(16, d)}) {  // a large budget and 16 rows
    PagedOptions opt;
    opt.causal = true;
    opt.sram_budget_bytes = budget;
    std::vector<bf16> want(static_cast<std::size_t>(total * hq * d));
    forward_paged_varlen(make_thd<const bf16>(q_rot.data(), total, hq, d), plain.cache.k_pages(0), plain.cache.v_pages(0),
                         plain_tables.block_table_view(), plain_tables.seqlens(), make_thd(want.data(), total, hq, d),
                         PackedLseView{}, cu, opt);
    opt.rotary = r;
    for (Backend backend : compiled_backends())
      for (int threads : {1, 2, 3}) {
        opt.execution = {backend, threads};
        std::vector<bf16> o(want.size());
        forward_paged_varlen(make_thd<const bf16>(q.data(), total, hq, d), fused.cache.k_pages(0), fused.cache.v_pages(0),
                             tables.block_table_view(), tables.seqlens(), make_thd(o.data(), total, hq, d), PackedLseView{},
                             cu, opt);
        EXPECT_TRUE(same_bits(o, want)) << to_string(backend) << " x " << threads << ", budget " << budget;
      }
  }
}

// ---- The cache writes -----------------------------------------------------------------------

/// write_kv_slots with rotary tables: K rows rotated at their positions bitwise as
/// apply_rotary then an unrotated write; V as it is; skipped tokens' positions never read.
template <class T>
void check_write_kv_slots() {
  const index_t P = 5, S = 3, hkv = 2, d = 17, n = 9;
  const Tables t = make_tables(50, 6, true);
  for (bool interleaved : {false, true}) {
    const RotaryOptions r = t.options(interleaved);
    const auto k = normal_values<T>(n * hkv * d, 31), v = normal_values<T>(n * hkv * d, 32);
    const std::vector<std::int64_t> slots{4, 0, -1, 14, 7, 3, -1, 9, 12};
    std::vector<std::int64_t> positions{49, 0, -7, 17, 3, 1, 1 << 30, 8, 2};  // -7, 2^30: skipped tokens
    std::vector<T> k_pool(static_cast<std::size_t>(P * S * hkv * d), from_float<T>(0.5f)), v_pool = k_pool;
    std::vector<T> k_want = k_pool, v_want = v_pool;
    write_kv_slots(rows_of(k.data(), n, hkv, d), rows_of(v.data(), n, hkv, d), make_page_pool(k_pool.data(), P, S, hkv, d),
                   make_page_pool(v_pool.data(), P, S, hkv, d), slots, r, positions);
    std::vector<T> k_rot = k;
    positions[2] = positions[6] = 0;
    apply_rotary(rows_of(k_rot.data(), n, hkv, d), positions, r);
    write_kv_slots(rows_of(k_rot.data(), n, hkv, d), rows_of(v.data(), n, hkv, d), make_page_pool(k_want.data(), P, S, hkv, d),
                   make_page_pool(v_want.data(), P, S, hkv, d), slots);
    EXPECT_TRUE(same_bits(k_pool, k_want)) << "interleaved " << interleaved;
    EXPECT_TRUE(same_bits(v_pool, v_want));
    EXPECT_FALSE(same_bits(k_rot, k));
  }
}

TEST(RotaryWrite, WriteKvSlotsFloat) { check_write_kv_slots<float>(); }
TEST(RotaryWrite, WriteKvSlotsBf16) { check_write_kv_slots<bf16>(); }
TEST(RotaryWrite, WriteKvSlotsFp16) { check_write_kv_slots<fp16>(); }

/// 8-bit pools rotate before they quantize: float rows bitwise as quantizing rows rotated by
/// apply_rotary (int8 scales grown to the rotated values); bf16 rows rotated in float (no
/// rounding to bf16 first) within the format's rounding of the double rotation.
template <class Q>
void check_quantized_write() {
  const index_t P = 4, S = 5, hkv = 2, d = 24, n = 11;
  const Tables t = make_tables(64, 8);
  const RotaryOptions r = t.options(false);
  const auto k = normal_values<float>(n * hkv * d, 41), v = normal_values<float>(n * hkv * d, 42);
  const std::vector<std::int64_t> slots{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
  const std::vector<std::int64_t> positions{0, 1, 2, 3, 4, 63, 6, 7, 8, 9, 30};
  const float fixed = 0.0625f;
  const auto write = [&](const std::vector<float>& rows, const RotaryOptions& rot, std::vector<Q>& kp, std::vector<float>& ks) {
    std::vector<Q> vp(kp.size());
    std::vector<float> vs(ks.size(), adaptive_scale<Q> ? 0.0f : fixed);
    write_kv_slots(rows_of(rows.data(), n, hkv, d), rows_of(v.data(), n, hkv, d), make_page_pool(kp.data(), P, S, hkv, d),
                   make_page_pool(vp.data(), P, S, hkv, d), slots, make_page_scales(ks.data(), P, hkv),
                   make_page_scales(vs.data(), P, hkv), rot, rot.enabled() ? std::span(positions) : std::span<const std::int64_t>{});
  };
  const auto fresh_scales = [&] { return std::vector<float>(static_cast<std::size_t>(P * hkv), adaptive_scale<Q> ? 0.0f : fixed); };
  std::vector<Q> k_pool(static_cast<std::size_t>(P * S * hkv * d)), k_want = k_pool;
  std::vector<float> k_scale = fresh_scales(), want_scale = fresh_scales();
  write(k, r, k_pool, k_scale);
  std::vector<float> k_rot = k;
  apply_rotary(rows_of(k_rot.data(), n, hkv, d), positions, r);
  write(k_rot, {}, k_want, want_scale);
  EXPECT_TRUE(same_bits(k_pool, k_want));
  EXPECT_TRUE(same_bits(k_scale, want_scale));
  // bf16 rows: rotated in float from their bf16 values, then quantized.
  std::vector<bf16> k16(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) k16[i] = from_float<bf16>(k[i]);
  std::vector<Q> k16_pool(k_pool.size()), v16_pool(k_pool.size());
  std::vector<float> k16_scale = fresh_scales(), v16_scale = fresh_scales();
  std::vector<bf16> v16(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) v16[i] = from_float<bf16>(v[i]);
  write_kv_slots(rows_of(k16.data(), n, hkv, d), rows_of(v16.data(), n, hkv, d), make_page_pool(k16_pool.data(), P, S, hkv, d),
                 make_page_pool(v16_pool.data(), P, S, hkv, d), slots, make_page_scales(k16_scale.data(), P, hkv),
                 make_page_scales(v16_scale.data(), P, hkv), r, positions);
  const auto exact = rotated(as_floats(k16), n, hkv, d, r, [&](index_t i) { return positions[static_cast<std::size_t>(i)]; });
  const PagePoolView<Q> pool = make_page_pool(k16_pool.data(), P, S, hkv, d);
  double worst = 0.0;
  for (index_t i = 0; i < n; ++i)
    for (index_t h = 0; h < hkv; ++h) {
      const index_t page = slots[static_cast<std::size_t>(i)] / S, row = slots[static_cast<std::size_t>(i)] % S;
      const float scale = k16_scale[static_cast<std::size_t>(page * hkv + h)];
      index_t later = 0;  // tokens written into the page after this one (slots go in order)
      for (index_t j = i + 1; j < n; ++j) later += slots[static_cast<std::size_t>(j)] / S == page;
      for (index_t c = 0; c < d; ++c) {
        const double x = exact[static_cast<std::size_t>((i * hkv + h) * d + c)];
        const double got = static_cast<double>(to_float(pool(page, row, h, c))) * scale;
        // int8: half a step of the page's final scale, and half a step more for each later
        // token that may have raised it (requantizing this row: kv_cache_fuzz's bound); fp8:
        // the format's relative rounding.
        const double bound = adaptive_scale<Q> ? 0.5 * static_cast<double>(1 + later) * scale * (1 + 1e-6)
                                               : std::abs(x) * 0x1p-3 + scale * 0x1p-9;
        worst = std::max(worst, std::abs(got - x) / bound);
      }
    }
  EXPECT_LE(worst, 1.0);
}

TEST(RotaryWrite, Int8RotatesBeforeQuantizing) { check_quantized_write<std::int8_t>(); }
TEST(RotaryWrite, Fp8E4m3RotatesBeforeQuantizing) { check_quantized_write<fp8_e4m3>(); }

/// An int8 KvCache appended with rotary, then decoded with options.rotary: the cache bitwise
/// as one appended with apply_rotary's rows, O bitwise as the unfused call and within the
/// forward's bound of the reference over the dequantized cache with Q rotated in double.
TEST(RotaryWrite, Int8CacheAndDecode) {
  const index_t hq = 4, hkv = 2, d = 32, len = 127, L = 2;
  const Tables t = make_tables(128, 16);
  const RotaryOptions r = t.options(true);
  const KvCacheConfig config{.num_layers = L, .num_pages = 20, .page_size = 16, .heads_kv = hkv, .head_dim = d};
  KvCache<std::int8_t> fused(config), plain(config);
  const auto k = normal_values<float>(L * len * hkv * d, 51), v = normal_values<float>(L * len * hkv * d, 52);
  std::vector<float> k_rot = k;
  apply_rotary(rows_of(k_rot.data(), L * len, hkv, d), iota_positions(L * len, 0, len), r);
  const auto all = [&](const std::vector<float>& x) { return make_bshd(x.data(), L, len, hkv, d); };
  const SequenceId a = fused.create(), b = plain.create();
  fused.append(a, all(k), all(v), r);
  plain.append(b, all(k_rot), all(v));
  for (index_t l = 0; l < L; ++l) {
    const auto bytes = [&](const KvCache<std::int8_t>& c) {
      const auto p = c.k_pages(l);
      return std::vector<std::int8_t>(p.data, p.data + 20 * 16 * hkv * d);
    };
    EXPECT_TRUE(same_bits(bytes(fused), bytes(plain))) << "layer " << l;
    const auto scales = [&](const KvCache<std::int8_t>& c) { return std::vector<float>(c.k_scales(l).data, c.k_scales(l).data + 20 * hkv); };
    EXPECT_TRUE(same_bits(scales(fused), scales(plain)));
  }
  const auto q = normal_values<float>(hq * d, 53);
  std::vector<float> q_rot = q;
  apply_rotary(rows_of(q_rot.data(), 1, hq, d), std::vector<std::int64_t>{len - 1}, r);
  const auto tables = fused.batch(std::vector{a});
  PagedOptions opt;
  opt.k_scale = fused.k_scales(1);
  opt.v_scale = fused.v_scales(1);
  std::vector<float> o(static_cast<std::size_t>(hq * d)), o2 = o, lse(static_cast<std::size_t>(hq));
  forward_paged(make_bshd<const float>(q_rot.data(), 1, 1, hq, d), fused.k_pages(1), fused.v_pages(1), tables.block_table_view(),
                tables.seqlens(), make_bshd(o2.data(), 1, 1, hq, d), opt);
  opt.rotary = r;
  forward_paged(make_bshd<const float>(q.data(), 1, 1, hq, d), fused.k_pages(1), fused.v_pages(1), tables.block_table_view(),
                tables.seqlens(), make_bshd(o.data(), 1, 1, hq, d), make_lse(lse.data(), 1, hq, 1), opt);
  EXPECT_TRUE(bitwise_equal(o, o2));
  std::vector<float> kd(static_cast<std::size_t>(len * hkv * d)), vd(kd.size());
  const auto kp = fused.k_pages(1), vp = fused.v_pages(1);
  const auto pages = fused.pages(a);
  for (index_t j = 0; j < len; ++j)
    for (index_t h = 0; h < hkv; ++h)
      for (index_t c = 0; c < d; ++c) {
        const std::int32_t page = pages[static_cast<std::size_t>(j / 16)];
        const auto at = static_cast<std::size_t>((j * hkv + h) * d + c);
        kd[at] = to_float(kp(page, j % 16, h, c)) * opt.k_scale(page, h);
        vd[at] = to_float(vp(page, j % 16, h, c)) * opt.v_scale(page, h);
      }
  const auto q_ref = rotated(q, 1, hq, d, r, [&](index_t) { return len - 1; });
  const auto ref = reference::attention<float>(make_bshd(q_ref.data(), 1, 1, hq, d), make_bshd(kd.data(), 1, len, hkv, d),
                                               make_bshd(vd.data(), 1, len, hkv, d), reference::Options::from(opt));
  expect_close(compare_to_reference(ref, make_bshd<const float>(o.data(), 1, 1, hq, d), make_lse(lse.data(), 1, hq, 1)));
}

// ---- Bad arguments ---------------------------------------------------------------------------

TEST(RotaryValidation, ForwardNamesEachBadArgumentAndWritesNothing) {
  const index_t nq = 3, nk = 5, d = 8;
  const auto q = normal_values<float>(nq * 2 * d, 61), k = normal_values<float>(nk * d, 62), v = normal_values<float>(nk * d, 63);
  const Tables good = make_tables(nk, 4), wide = make_tables(nk, 5), narrow = make_tables(nk, 3), short_ = make_tables(nk - 1, 4);
  std::vector<float> o_buffer(static_cast<std::size_t>(nq * 2 * d) + 64, sentinel), lse(static_cast<std::size_t>(2 * nq), sentinel);
  struct Case {
    std::string parameter;
    std::function<void(ForwardOptions&)> make_bad;
  };
  const std::vector<Case> cases{
      {"rotary_sin", [&](ForwardOptions& o) { o.rotary.sin = {}; }},
      {"rotary_cos", [&](ForwardOptions& o) { o.rotary.cos = {}; }},
      {"rotary_cos.shape[1] (rotary_dim / 2)", [&](ForwardOptions& o) { o.rotary = wide.options(false); }},
      {"rotary_cos.shape[1] (rotary_dim / 2)", [&](ForwardOptions& o) { o.rotary.cos.shape[1] = o.rotary.sin.shape[1] = 0; }},
      {"rotary_sin.shape[1] (rotary_dim / 2)", [&](ForwardOptions& o) { o.rotary.sin = narrow.options(false).sin; }},
      {"rotary_sin.shape[0] (max_position)", [&](ForwardOptions& o) { o.rotary.sin = short_.options(false).sin; }},
      {"rotary_cos", [&](ForwardOptions& o) { o.rotary = short_.options(false); }},  // the last query at position 4
      {"rotary_cos", [&](ForwardOptions& o) { o.diagonal_offset = -1; }},           // the first at -1
      {"rotary_cos", [&](ForwardOptions& o) { o.alignment = MaskAlignment::top_left, o.diagonal_offset = nk - 2; }},
      {"rotary_cos.stride[0] (max_position)", [&](ForwardOptions& o) { o.rotary.cos.stride[0] = -4; }},
      {"o", [&](ForwardOptions& o) { o.rotary.cos.data = o_buffer.data() + nq * 2 * d - 3; }},
      {"lse", [&](ForwardOptions& o) { o.rotary.sin.data = lse.data(); }},
  };
  for (const Case& c : cases) {
    ForwardOptions opt;
    opt.rotary = good.options(false);
    c.make_bad(opt);
    EXPECT_EQ(thrown_parameter([&] {
                forward(make_bshd(q.data(), 1, nq, 2, d), make_bshd(k.data(), 1, nk, 1, d), make_bshd(v.data(), 1, nk, 1, d),
                        make_bshd(o_buffer.data(), 1, nq, 2, d), make_lse(lse.data(), 1, 2, nq), opt);
              }),
              c.parameter);
    EXPECT_TRUE(all_equal(o_buffer, sentinel)) << c.parameter;
    EXPECT_TRUE(all_equal(lse, sentinel)) << c.parameter;
  }
  ForwardOptions opt;  // the backward does not rotate: rejected, not ignored
  opt.rotary = good.options(false);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dout = as_floats(normal_values<float>(nq * 2 * d, 64));
  EXPECT_EQ(thrown_parameter([&] {
              backward(make_bshd(q.data(), 1, nq, 2, d), make_bshd(k.data(), 1, nk, 1, d), make_bshd(v.data(), 1, nk, 1, d),
                       make_bshd<const float>(o_buffer.data(), 1, nq, 2, d),
                       SavedLseView{lse.data(), {1, 2, nq}, {2 * nq, nq, 1}}, make_bshd(dout.data(), 1, nq, 2, d),
                       make_bshd(dq.data(), 1, nq, 2, d), make_bshd(dk.data(), 1, nk, 1, d), make_bshd(dv.data(), 1, nk, 1, d),
                       BackwardOptions(opt));
            }),
            "rotary_cos");
}

TEST(RotaryValidation, PagedChecksEveryPositionAgainstTheTablesInTheCallAndThePlanner) {
  const Tables t = make_tables(16, 8);
  CachedBatch<float> batch({17, 5}, 16, 4, 0, {}, 3);
  const auto tables = batch.cache.batch(batch.ids);
  const auto q = normal_values<float>(2 * 2 * 4 * 16, 5);
  std::vector<float> o(q.size(), sentinel);
  PagedOptions opt;
  opt.rotary = t.options(false);  // 16 rows: sequence 0's query at position 16 is past them
  const auto qv = make_bshd<const float>(q.data(), 2, 2, 4, 16);
  const auto ov = make_bshd(o.data(), 2, 2, 4, 16);
  EXPECT_EQ(thrown_parameter([&] {
              forward_paged(qv, batch.cache.k_pages(0), batch.cache.v_pages(0), tables.block_table_view(), tables.seqlens(), ov, opt);
            }),
            "rotary_cos");
  EXPECT_EQ(thrown_parameter([&] {
              (void)plan_forward_paged(qv, batch.cache.k_pages(0), batch.cache.v_pages(0), tables.block_table_view(),
                                       tables.seqlens(), ov, LseView{}, opt);
            }),
            "rotary_cos");
  const std::vector<std::int32_t> cu{0, 1, 4};  // varlen: sequence 1 has 3 queries, 5 keys: fine; 0 has 1 at 16
  EXPECT_EQ(thrown_parameter([&] {
              forward_paged_varlen(make_thd<const float>(q.data(), 4, 4, 16), batch.cache.k_pages(0), batch.cache.v_pages(0),
                                   tables.block_table_view(), tables.seqlens(), make_thd(o.data(), 4, 4, 16), PackedLseView{},
                                   cu, opt);
            }),
            "rotary_cos");
  EXPECT_TRUE(all_equal(o, sentinel));
  const Tables enough = make_tables(17, 8);
  opt.rotary = enough.options(false);
  forward_paged(qv, batch.cache.k_pages(0), batch.cache.v_pages(0), tables.block_table_view(), tables.seqlens(), ov, opt);
  EXPECT_FALSE(all_equal(o, sentinel));
}

TEST(RotaryValidation, WritesNameEachBadArgumentAndChangeNothing) {
  const index_t P = 3, S = 4, hkv = 2, d = 8, n = 3;
  const Tables t = make_tables(10, 4), wide = make_tables(10, 5);
  const auto k = normal_values<float>(n * hkv * d, 71), v = normal_values<float>(n * hkv * d, 72);
  std::vector<float> k_pool(static_cast<std::size_t>(P * S * hkv * d), 0.5f), v_pool = k_pool;
  const std::vector<std::int64_t> slots{0, 5, -1};
  const auto attempt = [&](const RotaryOptions& r, std::span<const std::int64_t> positions) {
    const auto k_before = k_pool, v_before = v_pool;
    const std::string name = thrown_parameter([&] {
      write_kv_slots(rows_of(k.data(), n, hkv, d), rows_of(v.data(), n, hkv, d), make_page_pool(k_pool.data(), P, S, hkv, d),
                     make_page_pool(v_pool.data(), P, S, hkv, d), slots, r, positions);
    });
    if (!name.empty()) {
      EXPECT_TRUE(same_bits(k_pool, k_before) && same_bits(v_pool, v_before)) << name;
    }
    return name;
  };
  const std::vector<std::int64_t> good{1, 9, -3}, count{1, 9}, negative{-1, 2, 0}, past{1, 10, 0};
  EXPECT_EQ(attempt({}, good), "positions");  // positions without tables
  EXPECT_EQ(attempt(t.options(false), count), "positions");
  EXPECT_EQ(attempt(t.options(false), negative), "positions");
  EXPECT_EQ(attempt(t.options(false), past), "rotary_cos");
  EXPECT_EQ(attempt(wide.options(false), good), "rotary_cos.shape[1] (rotary_dim / 2)");
  RotaryOptions in_pool = t.options(false);
  in_pool.sin.data = v_pool.data() + 7;
  EXPECT_EQ(attempt(in_pool, good), "v_cache");
  EXPECT_EQ(attempt(t.options(false), good), "");  // skipped token 2's position -3 is not read

  // KvCache: write and append check before anything changes (append before it extends, and
  // the tables against every layer's pools, not only the first one written).
  KvCache<float> cache({.num_layers = 2, .num_pages = 4, .page_size = 4, .heads_kv = hkv, .head_dim = d});
  const SequenceId s = cache.create();
  std::vector<float> rows2(static_cast<std::size_t>(2 * 4 * hkv * d), 0.25f);  // [2 layers, up to 4 tokens, hkv, d]
  const TensorView<const float> one = make_bshd<const float>(rows2.data(), 2, 1, hkv, d);
  const TensorView<const float> four = make_bshd<const float>(rows2.data(), 2, 4, hkv, d);
  cache.append(s, one, one, t.options(false));
  const Tables two = make_tables(2, 4);
  const auto pools = [&] {
    std::vector<float> all;
    for (index_t l = 0; l < 2; ++l)
      for (const auto& p : {cache.k_pages(l), cache.v_pages(l)}) all.insert(all.end(), p.data, p.data + 4 * 4 * hkv * d);
    return all;
  };
  const auto before = pools();
  const index_t free_before = cache.free_pages();
  EXPECT_EQ(thrown_parameter([&] { cache.append(s, four, four, two.options(false)); }), "rotary_cos");  // positions 1..4
  RotaryOptions on_layer1 = t.options(false);
  on_layer1.cos = {cache.k_pages(1).data, {10, 4}, {4, 1}};
  EXPECT_EQ(thrown_parameter([&] { cache.append(s, four, four, on_layer1); }), "k_cache");
  EXPECT_EQ(cache.length(s), 1);
  EXPECT_EQ(cache.free_pages(), free_before);
  cache.extend(s, 2);
  EXPECT_EQ(thrown_parameter([&] {
              cache.write(0, s, rows_of<const float>(rows2.data(), 2, hkv, d), rows_of<const float>(rows2.data(), 2, hkv, d),
                          two.options(false));
            }),
            "rotary_cos");  // positions 1, 2: 2 is past the 2 rows
  EXPECT_TRUE(same_bits(pools(), before));

  // apply_rotary.
  std::vector<float> rows = k;
  EXPECT_EQ(thrown_parameter([&] { apply_rotary(rows_of(rows.data(), n, hkv, d), good, RotaryOptions{}); }), "rotary_cos");
  EXPECT_EQ(thrown_parameter([&] { apply_rotary(rows_of(rows.data(), n, hkv, d), count, t.options(false)); }), "positions");
  RotaryOptions on_rows = t.options(false);
  on_rows.cos.data = rows.data();
  const std::vector<std::int64_t> valid{1, 2, 3};
  EXPECT_EQ(thrown_parameter([&] { apply_rotary(rows_of(rows.data(), n, hkv, d), valid, on_rows); }), "rows");
  EXPECT_TRUE(same_bits(rows, k));
}

}  // namespace
}  // namespace tileattn::test
