// tests/fuzz/block_mask_fuzz.cpp: libFuzzer harness for tileattn::create_block_mask
// (tileattn/flex/block_mask.hpp) and the BlockMask it returns as forward_flex's mask
// (tileattn/flex.hpp).
//
// The fuzzer's bytes choose an attention call (batch 1 to 3, heads 1 to 4 with GQA groups,
// 0 to 48 queries and keys, head_dim 1 to 40 and head_dim_v apart, a softmax scale or the
// default, backend and thread count) and the block mask's arguments: batch and heads (1,
// which broadcasts, or the call's), seqlen_q / seqlen_k (the call's) and block sizes (1 to
// 80, 7, 13, 16, 64, 128, the sequence length, INT64_MAX); each of those six may instead be
// a special value: 0, negative, INT64_MIN, INT64_MAX, 2^31, 2^47, 2^62, 2^63 - 2^32, ...
// (so that element and block counts pass 2^47 and 2^63: issue 27's overflows, which
// segfaulted or wrapped to 0 stored blocks, are drawn), and the execution of
// create_block_mask (num_threads -1 or 1025 now and then). The mask_mod is one of: causal
// (offset -5..5), a sliding window (window_side's left/right, offset -5..5), prefix-LM, document ids
// (per sequence when the mask's batch is not 1), a random block-sparse layout from the
// input's bytes (per sequence and head when those are not 1; its own block size 1..20, so
// that it matches the block mask's or not), always false, always true. Sequences longer
// than 256 get only the masks that need no table (causal, window, prefix-LM, always
// false/true), with offset 0 (no mask_mod overflows at positions near INT64_MAX).
//
// Checks: create_block_mask either throws tileattn::invalid_argument naming exactly the
// parameter the documented order of checks names (num_threads; batch, heads, seqlen_q,
// seqlen_k, block; then the first extent at which batch x heads x query blocks x key
// blocks passes 2^47), or succeeds, and then:
//   - the accessors and q_blocks / kv_blocks are the arguments' and their ceil_div;
//   - every block's kind is exact: empty blocks hold no visible position, full ones no
//     hidden one, partial ones both. Against brute-force evaluation of the mask_mod when
//     batch x heads x seqlen_q x seqlen_k <= 2^16; against a closed form for the
//     interval masks (causal, window, prefix-LM, always false/true: each query row sees one
//     interval of keys whose ends never decrease) on larger sequences, up to INT64_MAX;
//   - count() and density() agree with the kinds; kinds() and kind() agree.
// A valid mask of more than 2^14 stored blocks is not built (it would allocate up to 2^47
// bytes); detail::block_kinds, its check and sizing, is run on it instead. create_block_mask
// evaluates every position of full and empty blocks, so the mask_mod counts its calls: past
// 2^17 it answers by the parity of q + kv (every block then ends at once, as partial or, at
// one position, anything) and the kinds are not checked, only that nothing crashed.
// Then, when the mask fits the call (batch and heads 1 or the call's, its seqlens), forward_flex
// with no score_mod and the block mask must match the double-precision flex reference
// (tests/reference/naive_flex.hpp) with the dense mask_mod within the flex suite's rule
// (tests/flex/flex_forward_test.cpp): |error| <= 2e-5 + 2 x the error of a naive fp32 flex
// attention on the same inputs, on O and the LSE, that naive error itself <= 1e-4; rows
// that see no key give O = 0 and LSE = -inf. A call of 0 queries or keys must be rejected
// naming q.shape[1] or k.shape[1] (forward() wants rows), whatever the mask. A valid mask that does not fit the call (a
// batch, heads or seqlen of another value) must make forward_flex throw invalid_argument
// naming block_mask with O and the LSE untouched. Anything else aborts (a crash, a sanitizer
// report, another exception, a wrong kind or value).
//
// -DBLOCK_MASK_FUZZ_BREAK flips the kind of the mask's first block after it is built (a
// planted error: the harness must abort on its seed corpus).
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target block_mask_fuzz
//   build-fuzz/tests/fuzz/block_mask_fuzz tests/fuzz/corpus/block_mask -max_len=256 -max_total_time=3600
// BLOCK_MASK_FUZZ_VERBOSE=1 prints what each input decodes to and how the call ended:
// build-fuzz/tests/fuzz/block_mask_fuzz FILE...  (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "reference/naive_flex.hpp"
#include "support/test_support.hpp"
#include "tileattn/flex.hpp"

namespace {

using namespace tileattn;
using tileattn::test::Deviation;
using tileattn::test::sentinel;
using i128 = __int128;

constexpr index_t int64_max = std::numeric_limits<index_t>::max();
constexpr index_t int64_min = std::numeric_limits<index_t>::min();
constexpr i128 pos_inf = i128{1} << 100, neg_inf = -pos_inf;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("block_mask_fuzz", what); }

// ---- The mask_mod -------------------------------------------------------------------------

enum class MaskKind { causal, window, prefix_lm, document, block_sparse, never, always, count };
constexpr const char* mask_names[] = {"causal", "sliding_window", "prefix_lm", "document",
                                      "block_sparse", "always false", "always true"};

/// Calls of the mask_mod, and how many it may make before it answers by parity.
struct Budget {
  std::atomic<std::int64_t> calls{0};
  std::int64_t limit = std::numeric_limits<std::int64_t>::max();
  bool exceeded() const { return calls.load() > limit; }
};

/// The tables a mask kind reads (document ids, block-sparse layouts), shared by its copies.
struct Tables {
  std::vector<std::vector<std::int32_t>> doc_q, doc_k;  // per sequence (one when not per batch)
  std::vector<std::vector<std::uint8_t>> layouts;       // per (sequence, head) (or one)
  index_t layout_block = 1, layout_kv_blocks = 0;
};

/// One mask_mod type for every kind (one forward_flex kernel to compile), calling the
/// library's functors (flex/mods.hpp) for causal, window, prefix-LM, document and block-sparse.
struct FuzzMask {
  MaskKind kind = MaskKind::always;
  flex::causal causal{};
  flex::sliding_window window{};
  flex::prefix_lm prefix{};
  bool per_batch = false, per_head = false;  // tables differ by sequence / head
  index_t heads = 1;                         // heads of the tables (per_head)
  const Tables* tables = nullptr;
  Budget* budget = nullptr;

  bool operator()(index_t b, index_t h, index_t q, index_t kv) const {
    if (budget && budget->calls.fetch_add(1, std::memory_order_relaxed) >= budget->limit) return ((q ^ kv) & 1) != 0;
    switch (kind) {
      case MaskKind::causal: return causal(b, h, q, kv);
      case MaskKind::window: return window(b, h, q, kv);
      case MaskKind::prefix_lm: return prefix(b, h, q, kv);
      case MaskKind::document: {
        const auto s = static_cast<std::size_t>(per_batch ? b : 0);
        return flex::document{tables->doc_q[s], tables->doc_k[s]}(b, h, q, kv);
      }
      case MaskKind::block_sparse: {
        const auto s = static_cast<std::size_t>((per_batch ? b : 0) * heads + (per_head ? h : 0));
        return flex::block_sparse{tables->layouts[s], tables->layout_kv_blocks, tables->layout_block}(b, h, q, kv);
      }
      case MaskKind::never: return false;
      default: return true;
    }
  }
};

/// The interval masks' keys for query i: [lo, hi] (lo > hi: none), never decreasing in i.
struct Interval {
  i128 lo, hi;
};
Interval interval(const FuzzMask& m, i128 i) {
  switch (m.kind) {
    case MaskKind::causal: return {neg_inf, i + m.causal.offset};
    case MaskKind::window: {
      const i128 diag = i + m.window.offset;
      return {m.window.left < 0 ? neg_inf : diag - m.window.left, m.window.right < 0 ? pos_inf : diag + m.window.right};
    }
    case MaskKind::prefix_lm: return {neg_inf, std::max<i128>(i128{m.prefix.prefix} - 1, i)};
    case MaskKind::never: return {pos_inf, neg_inf};
    default: return {neg_inf, pos_inf};
  }
}
bool is_interval_mask(MaskKind k) { return k != MaskKind::document && k != MaskKind::block_sparse; }

/// The kind of block [q0, q1) x [k0, k1) of an interval mask, in closed form.
BlockKind interval_kind(const FuzzMask& m, i128 q0, i128 q1, i128 k0, i128 k1) {
  if (m.kind == MaskKind::never) return BlockKind::empty;
  // Rows that reach k0 (hi >= k0) are a suffix; rows that start by k1 - 1 (lo <= k1 - 1) a prefix.
  i128 a = q0, z = q1;  // first row with hi >= k0 in [q0, q1], q1 if none
  while (a < z) {
    const i128 mid = a + (z - a) / 2;
    if (interval(m, mid).hi >= k0) z = mid;
    else a = mid + 1;
  }
  i128 lo = q0 - 1, hi = q1 - 1;  // last row with lo <= k1 - 1 in [q0 - 1, q1 - 1]
  while (lo < hi) {
    const i128 mid = hi - (hi - lo) / 2;
    if (interval(m, mid).lo <= k1 - 1) lo = mid;
    else hi = mid - 1;
  }
  if (a > lo) return BlockKind::empty;
  if (interval(m, q1 - 1).lo <= k0 && interval(m, q0).hi >= k1 - 1) return BlockKind::full;
  return BlockKind::partial;
}

const char* name(BlockKind k) { return k == BlockKind::empty ? "empty" : k == BlockKind::full ? "full" : "partial"; }

// ---- What the input asks for --------------------------------------------------------------

struct Problem {
  // The attention call.
  index_t batch = 1, hq = 1, hkv = 1, nq = 0, nk = 0, d = 1, dv = 1;
  std::optional<float> scale;
  Execution forward_exec{};
  bool with_lse = false;
  std::uint32_t seed = 0;
  // The block mask's arguments.
  index_t mb = 1, mh = 1, sq = 0, sk = 0;
  BlockSize block{};
  Execution exec{};
  FuzzMask mask;
  Tables tables;
};

/// Values past every bound the block mask has (and a few inside them).
index_t special(FuzzedDataProvider& in) {
  constexpr index_t values[] = {0,          1,           2,          3,
                                -1,         -2,          int64_min,  int64_max,
                                int64_max - 1, index_t{1} << 31, (index_t{1} << 31) - 1, (index_t{1} << 32) + 1,
                                index_t{1} << 47, (index_t{1} << 47) + 1, index_t{1} << 62, (index_t{1} << 62) + 1,
                                int64_max - (index_t{1} << 32) + 1, index_t{1} << 24, index_t{1} << 23, 1000003};
  const auto i = in.ConsumeIntegralInRange<std::size_t>(0, std::size(values));
  return i < std::size(values) ? values[i] : in.ConsumeIntegral<index_t>();
}

/// A block size for a sequence of n positions.
index_t block_size(FuzzedDataProvider& in, index_t n) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0: return 7;
    case 1: return 13;
    case 2: return 16;
    case 3: return in.ConsumeBool() ? 64 : 128;
    case 4: return std::max<index_t>(n, 1);
    case 5: return int64_max;
    default: return in.ConsumeIntegralInRange<index_t>(1, 80);
  }
}

/// Replaces `x` with a special value now and then (the input's choice).
void maybe_special(FuzzedDataProvider& in, index_t& x, bool wild) {
  if (wild && in.ConsumeIntegralInRange(0, 2) == 0) x = special(in);
}

void build(FuzzedDataProvider& in, Problem& p) {
  p.seed = in.ConsumeIntegral<std::uint32_t>();
  p.batch = in.ConsumeIntegralInRange(1, 3);
  p.hkv = in.ConsumeIntegralInRange(1, 2);
  p.hq = p.hkv * in.ConsumeIntegralInRange(1, 2);
  p.nq = in.ConsumeIntegralInRange(0, 48);
  p.nk = in.ConsumeIntegralInRange(0, 48);
  p.d = in.ConsumeIntegralInRange(1, 40);
  p.dv = in.ConsumeBool() ? p.d : in.ConsumeIntegralInRange(1, 24);
  if (in.ConsumeBool()) p.scale = in.ConsumeFloatingPointInRange(0.01f, 1.0f);
  p.with_lse = in.ConsumeBool();
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  const auto backend = [&] {
    const Backend b = backends[in.ConsumeIntegralInRange(0, 3)];
    return backend_available(b) ? b : Backend::serial;
  };
  p.forward_exec = {backend(), in.ConsumeIntegralInRange(0, 3)};

  p.mb = in.ConsumeBool() ? 1 : p.batch;
  p.mh = in.ConsumeBool() ? 1 : p.hq;
  p.sq = p.nq;
  p.sk = p.nk;
  p.block = {block_size(in, p.nq), block_size(in, p.nk)};
  const bool wild = in.ConsumeIntegralInRange(0, 2) == 0;
  maybe_special(in, p.mb, wild);
  maybe_special(in, p.mh, wild);
  maybe_special(in, p.sq, wild);
  maybe_special(in, p.sk, wild);
  maybe_special(in, p.block.q, wild);
  maybe_special(in, p.block.kv, wild);
  p.exec = {backend(), in.ConsumeIntegralInRange(0, 3)};
  if (in.ConsumeIntegralInRange(0, 15) == 0) p.exec.num_threads = in.ConsumeBool() ? -1 : max_threads + 1;

  FuzzMask& m = p.mask;
  m.kind = static_cast<MaskKind>(in.ConsumeIntegralInRange(0, static_cast<int>(MaskKind::count) - 1));
  const bool large = p.sq > 256 || p.sk > 256;
  if (large && !is_interval_mask(m.kind)) m.kind = MaskKind::causal;
  const index_t offset = large ? 0 : in.ConsumeIntegralInRange<index_t>(-5, 5);
  m.causal.offset = offset;
  m.window = {fuzz::window_side(in), fuzz::window_side(in), offset};
  m.prefix.prefix = in.ConsumeBool() ? in.ConsumeIntegralInRange<index_t>(0, 60) : special(in);
  // Tables for the sizes the mask covers (small here: at most 256 positions).
  const index_t tq = std::max<index_t>(p.sq, 0), tk = std::max<index_t>(p.sk, 0);
  const index_t table_batch = p.mb >= 1 && p.mb <= 3 ? p.mb : 1, table_heads = p.mh >= 1 && p.mh <= 4 ? p.mh : 1;
  m.per_batch = table_batch > 1 && in.ConsumeBool();
  m.per_head = table_heads > 1 && in.ConsumeBool();
  m.heads = m.per_head ? table_heads : 1;
  std::mt19937 rng(p.seed);
  if (m.kind == MaskKind::document) {
    // Documents of 1..max_len positions each; keys and queries may follow different ids.
    const index_t max_len = in.ConsumeIntegralInRange<index_t>(1, 24);
    const bool same = in.ConsumeBool();
    const auto ids = [&](index_t n) {
      std::vector<std::int32_t> out(static_cast<std::size_t>(n));
      std::int32_t doc = 0;
      for (index_t i = 0; i < n;) {
        const index_t len = 1 + static_cast<index_t>(rng() % static_cast<std::uint32_t>(max_len));
        for (index_t j = 0; j < len && i < n; ++j, ++i) out[static_cast<std::size_t>(i)] = doc;
        ++doc;
      }
      return out;
    };
    for (index_t s = 0; s < (m.per_batch ? table_batch : 1); ++s) {
      p.tables.doc_q.push_back(ids(tq));
      if (same) {
        auto k = p.tables.doc_q.back();
        k.resize(static_cast<std::size_t>(tk), k.empty() ? 0 : k.back() + 1);
        p.tables.doc_k.push_back(std::move(k));
      } else {
        p.tables.doc_k.push_back(ids(tk));
      }
    }
  } else if (m.kind == MaskKind::block_sparse) {
    Tables& t = p.tables;
    t.layout_block = in.ConsumeIntegralInRange<index_t>(1, 20);
    if (in.ConsumeBool() && p.block.q == p.block.kv && p.block.q >= 1 && p.block.q <= 80) t.layout_block = p.block.q;
    const index_t lq = detail::ceil_div(tq, t.layout_block);
    t.layout_kv_blocks = detail::ceil_div(tk, t.layout_block);
    const int density = in.ConsumeIntegralInRange(0, 4);  // of 4: 0 (none) .. 4 (all)
    for (index_t s = 0; s < (m.per_batch ? table_batch : 1) * m.heads; ++s) {
      std::vector<std::uint8_t> layout(static_cast<std::size_t>(lq * t.layout_kv_blocks));
      for (auto& x : layout) x = (in.remaining_bytes() ? in.ConsumeIntegral<std::uint8_t>() : rng()) % 4 < static_cast<unsigned>(density);
      t.layouts.push_back(std::move(layout));
    }
  }
  m.tables = &p.tables;
}

std::string describe(const Problem& p) {
  const FuzzMask& m = p.mask;
  std::string s = std::string("mask ") + mask_names[static_cast<int>(m.kind)];
  switch (m.kind) {
    case MaskKind::causal: s += " offset " + std::to_string(m.causal.offset); break;
    case MaskKind::window:
      s += " left " + std::to_string(m.window.left) + " right " + std::to_string(m.window.right) + " offset " +
           std::to_string(m.window.offset);
      break;
    case MaskKind::prefix_lm: s += " prefix " + std::to_string(m.prefix.prefix); break;
    case MaskKind::block_sparse:
      s += " layout block " + std::to_string(p.tables.layout_block) + " x " + std::to_string(p.tables.layouts.size());
      break;
    case MaskKind::document: s += " x " + std::to_string(p.tables.doc_q.size()); break;
    default: break;
  }
  if (m.per_batch) s += " per batch";
  if (m.per_head) s += " per head";
  s += "; create_block_mask(batch " + std::to_string(p.mb) + ", heads " + std::to_string(p.mh) + ", seqlen_q " +
       std::to_string(p.sq) + ", seqlen_k " + std::to_string(p.sk) + ", block " + std::to_string(p.block.q) + " x " +
       std::to_string(p.block.kv) + ", " + to_string(p.exec.backend) + " x " + std::to_string(p.exec.num_threads) +
       "); call B " + std::to_string(p.batch) + " H " + std::to_string(p.hq) + "/" + std::to_string(p.hkv) + " Nq " +
       std::to_string(p.nq) + " Nk " + std::to_string(p.nk) + " d " + std::to_string(p.d) + " dv " +
       std::to_string(p.dv) + " scale " + (p.scale ? std::to_string(*p.scale) : "default") + " lse " +
       std::to_string(p.with_lse) + " " + to_string(p.forward_exec.backend) + " x " +
       std::to_string(p.forward_exec.num_threads);
  return s;
}

// ---- The model of create_block_mask's checks ----------------------------------------------

constexpr i128 max_blocks = max_allocation_bytes;  // one byte a block
constexpr i128 built_blocks = i128{1} << 14;      // larger valid masks are sized, not built
constexpr std::int64_t call_budget = std::int64_t{1} << 17;

/// The parameter create_block_mask must name ("" if valid), and the stored block count.
std::string expected_error(const Problem& p, i128& blocks) {
  blocks = 0;
  if (p.exec.num_threads < 0 || p.exec.num_threads > max_threads) return "num_threads";
  if (p.mb < 1) return "batch";
  if (p.mh < 1) return "heads";
  if (p.sq < 0) return "seqlen_q";
  if (p.sk < 0) return "seqlen_k";
  if (p.block.q < 1 || p.block.kv < 1) return "block";
  const i128 qb = (i128{p.sq} + p.block.q - 1) / p.block.q, kb = (i128{p.sk} + p.block.kv - 1) / p.block.kv;
  blocks = 1;
  const std::pair<i128, const char*> factors[] = {{p.mb, "batch"}, {p.mh, "heads"}, {qb, "seqlen_q"}, {kb, "seqlen_k"}};
  for (const auto& [factor, name] : factors) {
    blocks *= factor;  // factors < 2^63, blocks <= 2^47 before: no overflow in 128 bits
    if (blocks > max_blocks) return name;
  }
  return "";
}

// ---- The checks of a built mask -----------------------------------------------------------

void check_sizes(const Problem& p, const BlockKinds& k) {
  const index_t qb = detail::ceil_div(p.sq, p.block.q), kb = detail::ceil_div(p.sk, p.block.kv);
  if (k.batch != p.mb || k.heads != p.mh || k.seqlen_q != p.sq || k.seqlen_k != p.sk || k.block.q != p.block.q ||
      k.block.kv != p.block.kv || k.q_blocks != qb || k.kv_blocks != kb)
    fail("the block mask's extents are not its arguments': " + std::to_string(k.q_blocks) + " x " +
         std::to_string(k.kv_blocks) + " blocks\n  " + describe(p));
}

/// Every block's kind against brute force (small) or the closed form (interval masks).
void check_kinds(const Problem& p, const BlockMask<FuzzMask>& bm, bool verbose) {
  check_sizes(p, bm.kinds());
  if (bm.mask_mod().budget->exceeded()) {
    if (verbose) std::fprintf(stderr, "block_mask_fuzz: past the call budget: kinds not checked\n");
    return;
  }
  const FuzzMask& m = p.mask;
  const bool brute = i128{p.mb} * p.mh * p.sq * p.sk <= (i128{1} << 16);
  if (!brute && !is_interval_mask(m.kind)) fail("harness: a table mask on large sequences\n  " + describe(p));
  std::array<index_t, 3> counts{};
  const index_t qbn = bm.q_blocks(), kbn = bm.kv_blocks();
  // No blocks (a seqlen of 0): batch and heads may be up to 2^47, with nothing to visit.
  for (index_t b = 0; b < (qbn && kbn ? p.mb : 0); ++b)
    for (index_t h = 0; h < p.mh; ++h)
      for (index_t qb = 0; qb < qbn; ++qb)
        for (index_t kb = 0; kb < kbn; ++kb) {
          const i128 q0 = i128{qb} * p.block.q, q1 = std::min<i128>(p.sq, q0 + p.block.q);
          const i128 k0 = i128{kb} * p.block.kv, k1 = std::min<i128>(p.sk, k0 + p.block.kv);
          BlockKind want;
          std::string seen;
          if (brute) {
            index_t visible = 0, total = 0;
            for (index_t i = static_cast<index_t>(q0); i < q1; ++i)
              for (index_t j = static_cast<index_t>(k0); j < k1; ++j, ++total) {
                FuzzMask dense = m;  // no budget
                dense.budget = nullptr;
                visible += dense(b, h, i, j);
              }
            want = visible == 0 ? BlockKind::empty : visible == total ? BlockKind::full : BlockKind::partial;
            seen = std::to_string(visible) + " of its " + std::to_string(total) + " positions visible";
          } else {
            want = interval_kind(m, q0, q1, k0, k1);
            seen = "closed form";
          }
          ++counts[static_cast<std::size_t>(want)];
          const BlockKind got = bm.kind(b, h, qb, kb);
          if (got != want)
            fail("block (" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(qb) + ", " +
                 std::to_string(kb) + ") is " + name(got) + ", " + seen + ": " + name(want) + "\n  " + describe(p));
          if (bm.kinds()(b, h, qb, kb) != got) fail("kinds() and kind() disagree\n  " + describe(p));
        }
  if (bm.count(BlockKind::empty) != counts[0] || bm.count(BlockKind::partial) != counts[1] ||
      bm.count(BlockKind::full) != counts[2])
    fail("count() disagrees with the kinds\n  " + describe(p));
  const double blocks = static_cast<double>(counts[0] + counts[1] + counts[2]);
  if (bm.density() != (blocks > 0 ? 1.0 - static_cast<double>(counts[0]) / blocks : 0.0))
    fail("density() disagrees with the kinds\n  " + describe(p));
  if (verbose)
    std::fprintf(stderr, "block_mask_fuzz: %s: %lld empty, %lld partial, %lld full\n", brute ? "brute force" : "closed form",
                 static_cast<long long>(counts[0]), static_cast<long long>(counts[1]), static_cast<long long>(counts[2]));
}

// ---- forward_flex with the mask ---------------------------------------------------------------

std::vector<float> normal_values(std::mt19937& rng, index_t n) {
  std::normal_distribution<float> normal;
  std::vector<float> out(static_cast<std::size_t>(std::max<index_t>(n, 1)));
  for (float& x : out) x = normal(rng);
  return out;
}

/// forward_flex with `bm`: the reference's result when it fits the call, else block_mask named.
void check_forward(const Problem& p, const BlockMask<FuzzMask>& bm, bool verbose) {
  std::mt19937 rng(p.seed ^ 0x5bd1e995u);
  std::vector<float> q = normal_values(rng, p.batch * p.nq * p.hq * p.d), k = normal_values(rng, p.batch * p.nk * p.hkv * p.d),
                     v = normal_values(rng, p.batch * p.nk * p.hkv * p.dv);
  std::vector<float> o(static_cast<std::size_t>(std::max<index_t>(p.batch * p.nq * p.hq * p.dv, 1)), sentinel);
  std::vector<float> lse(static_cast<std::size_t>(std::max<index_t>(p.batch * p.hq * p.nq, 1)), sentinel);
  const TensorView<const float> qv = make_bshd(static_cast<const float*>(q.data()), p.batch, p.nq, p.hq, p.d),
                                kv = make_bshd(static_cast<const float*>(k.data()), p.batch, p.nk, p.hkv, p.d),
                                vv = make_bshd(static_cast<const float*>(v.data()), p.batch, p.nk, p.hkv, p.dv);
  const TensorView<float> ov = make_bshd(o.data(), p.batch, p.nq, p.hq, p.dv);
  const LseView lv = p.with_lse ? make_lse(lse.data(), p.batch, p.hq, p.nq) : LseView{};
  ForwardOptions opts;
  opts.softmax_scale = p.scale;
  opts.execution = p.forward_exec;
  const bool fits = (p.mb == 1 || p.mb == p.batch) && (p.mh == 1 || p.mh == p.hq) && p.sq == p.nq && p.sk == p.nk;
  try {
    forward_flex(qv, kv, vv, ov, lv, flex::no_score_mod{}, bm, opts);
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("block_mask_fuzz", err);
    if (!test::all_equal(o, sentinel) || !test::all_equal(lse, sentinel))
      fail(std::string("forward_flex wrote outputs before throwing: ") + err.what() + "\n  " + describe(p));
    // forward() wants rows (q.shape[1] and k.shape[1] > 0), whatever the mask.
    if (p.nq == 0 || p.nk == 0) {
      if (err.parameter().rfind("q.shape[1]", 0) != 0 && err.parameter().rfind("k.shape[1]", 0) != 0)
        fail(std::string("forward_flex without rows named ") + err.parameter() + ": " + err.what() + "\n  " + describe(p));
      return;
    }
    if (fits) fail(std::string("forward_flex rejected a mask that fits: ") + err.what() + "\n  " + describe(p));
    if (err.parameter() != "block_mask")
      fail(std::string("forward_flex named ") + err.parameter() + ", not block_mask: " + err.what() + "\n  " + describe(p));
    if (verbose) std::fprintf(stderr, "block_mask_fuzz: forward_flex threw (as it must): %s\n", err.what());
    return;
  }
  if (!fits) fail("forward_flex accepted a block mask of another shape\n  " + describe(p));
  if (p.nq == 0 || p.nk == 0) fail("forward_flex accepted a call without rows\n  " + describe(p));
  FuzzMask dense = p.mask;
  dense.budget = nullptr;
  const float scale = p.scale.value_or(1.0f / std::sqrt(static_cast<float>(p.d)));
  const auto ref = reference::flex_attention<float>(qv, kv, vv, flex::no_score_mod{}, dense, scale);
  const Deviation dev = test::compare_to_reference(ref, ov, lv);
  std::vector<float> naive_o(o.size()), naive_lse(lse.size());
  reference::flex_attention_naive<float>(qv, kv, vv, flex::no_score_mod{}, dense, scale,
                                         make_bshd(naive_o.data(), p.batch, p.nq, p.hq, p.dv),
                                         make_lse(naive_lse.data(), p.batch, p.hq, p.nq));
  const Deviation naive = test::compare_to_reference(ref, make_bshd(naive_o.data(), p.batch, p.nq, p.hq, p.dv),
                                                     make_lse(naive_lse.data(), p.batch, p.hq, p.nq));
  if (verbose)
    std::fprintf(stderr, "block_mask_fuzz: forward_flex error %.3g on O, %.3g on LSE (naive %.3g, %.3g)\n", dev.o,
                 dev.lse, naive.o, naive.lse);
  if (!dev.problem.empty()) fail("forward_flex differs from the reference: " + dev.problem + "\n  " + describe(p));
  if (!naive.problem.empty() || naive.o > 1e-4 || naive.lse > 1e-4)
    fail("harness: the naive flex attention is far from the reference\n  " + describe(p));
  const double floor = test::forward_o_tolerance;
  if (dev.o > floor + 2 * naive.o || dev.lse > floor + 2 * naive.lse)
    fail("forward_flex error " + std::to_string(dev.o) + " on O, " + std::to_string(dev.lse) + " on LSE (naive " +
         std::to_string(naive.o) + ", " + std::to_string(naive.lse) + ")\n  " + describe(p));
  if (!p.with_lse && !test::all_equal(lse, sentinel)) fail("wrote an LSE that was not asked for\n  " + describe(p));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool verbose = std::getenv("BLOCK_MASK_FUZZ_VERBOSE") != nullptr;
  FuzzedDataProvider in(data, size);
  Problem p;
  build(in, p);
  Budget budget;
  p.mask.budget = &budget;
  i128 blocks = 0;
  const std::string want = expected_error(p, blocks);
  if (verbose) std::fprintf(stderr, "block_mask_fuzz: %s\n  expect %s\n", describe(p).c_str(), want.empty() ? "success" : want.c_str());
  if (want.empty() && blocks > built_blocks) {
    // Valid, but up to 2^47 bytes: only sized (the constructor's check), not built.
    const BlockKinds k = detail::block_kinds(p.mb, p.mh, p.sq, p.sk, p.block);
    check_sizes(p, k);
    if (verbose) std::fprintf(stderr, "block_mask_fuzz: %lld blocks: sized, not built\n", static_cast<long long>(blocks));
    return 0;
  }
  budget.limit = call_budget;
  std::optional<BlockMask<FuzzMask>> bm;
  try {
    bm.emplace(create_block_mask(p.mask, p.mb, p.mh, p.sq, p.sk, p.block, p.exec));
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("block_mask_fuzz", err);
    if (verbose) std::fprintf(stderr, "block_mask_fuzz: threw %s\n", err.what());
    if (err.parameter() != want)
      fail(std::string("create_block_mask named ") + err.parameter() + (want.empty() ? ", valid arguments" : ", not " + want) +
           ": " + err.what() + "\n  " + describe(p));
    return 0;
  }
  if (!want.empty()) fail("create_block_mask accepted arguments it must reject (" + want + ")\n  " + describe(p));
#ifdef BLOCK_MASK_FUZZ_BREAK
  if (blocks > 0)
    bm->set_kind(0, 0, 0, 0, bm->kind(0, 0, 0, 0) == BlockKind::full ? BlockKind::partial : BlockKind::full);
#endif
  check_kinds(p, *bm, verbose);
  budget.limit = std::numeric_limits<std::int64_t>::max();
  // forward_flex on call-sized masks only (the call is at most 3 x 4 x 48 x 48).
  const bool small = p.mb <= 3 && p.mh <= 4 && p.sq <= 48 && p.sk <= 48 && !budget.exceeded();
  if (small) check_forward(p, *bm, verbose);
  return 0;
}
