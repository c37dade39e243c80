// tests/fuzz/forward_fuzz.cpp: libFuzzer harness for tileattn::forward and forward_varlen.
//
// The fuzzer's bytes choose everything a caller can: fixed-length or packed varlen batches,
// shapes (head_dim and head_dim_v apart, GQA groups), memory layouts (padded rows, permuted
// [B, H, N, D], stride-0 broadcast K/V), every option (causal and both alignments, windows
// up to INT64_MAX, softcap from subnormal to FLT_MAX, scales, ALiBi, sinks, bias and mask
// with broadcast dimensions, dropout), the SRAM budget, backend and thread count, NaN and
// Inf at chosen elements, and then one corruption from a list of bad arguments (or none).
// Each call must either throw tileattn::invalid_argument with O and LSE untouched, or
// match the double-precision reference (NaN rows and all) within the accuracy bound,
// writing nothing outside the O and LSE views (nor O rows or LSE entries of a varlen buffer
// that no sequence covers).
// Anything else aborts (a crash, a sanitizer report, another exception, a wrong result).
//
// Storage types and layouts: the optional trailing bytes. FuzzedDataProvider takes
// integers from the END of the input, so bytes read after everything above are the input's
// first unused ones, and most inputs have some to spare. They only count after a 4-byte tag
// ("ta16" in file order, just before the bytes build() read; libFuzzer finds such a
// constant through its comparison tracing), so every input written before they existed
// keeps its meaning: float, laid out as generated, one call. After the tag (bytes missing
// at the input's start read as 0):
//   1. the storage type of Q, K, V and O: float, bf16 or fp16 (0, 1, 2 mod 3). The inputs
//      are drawn in float, rounded to the type, and the reference runs on the rounded
//      values; O is read back exactly (every 16-bit value is a float).
//   2. one byte per tensor (Q, K, V, O) that re-lays it out (relayout_of): shifted 0 to 3
//      elements from its allocation's start (16-bit views whose data is only 2-byte
//      aligned), and/or copied into a fresh layout (four dimension orders, head_dim
//      innermost or strided, innermost stride 1 or 2, a gap of 0 to 3 elements after each
//      dimension: odd row and head strides, K/V broadcast kept). Gaps of Q/K/V hold NaN, so
//      a read outside a view poisons a row; gaps of O hold the sentinel.
//   3. a flags byte: run the call a second time on another backend and thread count and
//      require bitwise-identical O and LSE (Execution promises it).
//   4. a rotary byte: 0 (and 3 mod 4) none; 1 mod 4 rotary embedding of Q (options.rotary)
//      with tables of 1..head_dim / 2 columns (from the byte) and enough rows for every query
//      position plus 0..3 (none where a position is negative), in either table layout, NeoX or
//      interleaved pairs, now and then a NaN entry (fuzz_rotary.hpp: the bytes after it);
//      2 mod 4 tables that do not fit (a row short, or wider than head_dim), which must be
//      rejected. The reference rotates Q first, as the definition says, rounded to T.
// Bounds: the float path is held to 1e-4 absolute on O and the LSE (N(0, 1) inputs, scales
// up to 1, d up to 72). bf16 (vdpbf16ps tiles) rounds P to bf16 for P V (relative error
// <= 2^-8 per probability, the sum of P stays in float: <= 2^-8 max|V| on O) and O once
// when stored (<= 2^-8 |O| <= 2^-8 max|V|): 1e-4 + 2^-7 max|V|. fp16 (float tiles) only
// rounds O (<= 2^-11 |O|): 1e-4 + 2^-10 max|V|. max|V| is over V's finite elements. The LSE
// is float from fp32 scores and sums in every type: 1e-4.
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target forward_fuzz
//   build-fuzz/tests/fuzz/forward_fuzz tests/fuzz/corpus/forward -max_total_time=3600
// FORWARD_FUZZ_VERBOSE=1 prints what each input decodes to (and how many of its bytes were
// left over for the trailing ones): build-fuzz/tests/fuzz/forward_fuzz FILE...
// (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_layouts.hpp"
#include "fuzz/fuzz_rotary.hpp"
#include "fuzz/fuzz_support.hpp"
#include "support/test_support.hpp"

namespace {

using namespace tileattn;
using fuzz::Buffer;
using fuzz::Relayout;
using fuzz::Stored;
using fuzz::make_stored;
using fuzz::mirror;
using fuzz::orders;
using fuzz::relayout_of;
using tileattn::test::Deviation;
using tileattn::test::sentinel;

using fuzz::all_bits_equal;
using fuzz::changed_outside;
using fuzz::inf;
using fuzz::nan;
using fuzz::attention_chunk;
using fuzz::window_side;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("forward_fuzz", what); }

/// The names of fuzz::orders for Q, K, V and O, in failure messages.
constexpr const char* order_names[] = {"bshd", "bhsd", "bhds", "sbdh"};

/// A buffer of N(0, 1) values (seeded from the input) with a view in a chosen layout.
Buffer make_tensor(FuzzedDataProvider& in, index_t b, index_t n, index_t h, index_t d, bool allow_broadcast,
                   std::mt19937& rng) {
  Buffer t;
  const int layout = in.ConsumeIntegralInRange(0, allow_broadcast ? 3 : 2);
  std::size_t size = 0;
  switch (layout) {
    case 0:  // contiguous [B, N, H, D]
      size = static_cast<std::size_t>(b * n * h * d);
      t.data.resize(std::max<std::size_t>(size, 1));
      t.view = make_bshd(t.data.data(), b, n, h, d);
      break;
    case 1:  // [B, H, N, D]
      size = static_cast<std::size_t>(b * n * h * d);
      t.data.resize(std::max<std::size_t>(size, 1));
      t.view = make_bhsd(t.data.data(), b, h, n, d);
      break;
    case 2: {  // rows 2.. of a padded [B, N + 3, H, D + 5] buffer
      const index_t rows = n + 3, dp = d + 5;
      size = static_cast<std::size_t>(b * rows * h * dp);
      t.data.resize(size);
      t.view = {t.data.data() + 2 * h * dp, {b, n, h, d}, {rows * h * dp, h * dp, dp, 1}};
      break;
    }
    default:  // one row broadcast over the sequence (stride 0)
      size = static_cast<std::size_t>(b * h * d);
      t.data.resize(size);
      t.view = {t.data.data(), {b, n, h, d}, {h * d, 0, d, 1}};
      break;
  }
  std::normal_distribution<float> normal;
  for (float& x : t.data) x = normal(rng);
  return t;
}

/// Puts up to three NaN or Inf values at chosen elements of a tensor (when the input asks).
void poison(FuzzedDataProvider& in, Buffer& t) {
  const int count = in.ConsumeIntegralInRange(0, 3) * (in.ConsumeIntegralInRange(0, 7) == 0);
  const float values[] = {nan, inf, -inf};
  for (int i = 0; i < count && !t.data.empty(); ++i)
    t.data[in.ConsumeIntegralInRange<std::size_t>(0, t.data.size() - 1)] = values[in.ConsumeIntegralInRange(0, 2)];
}

struct Problem {
  bool varlen = false;
  index_t batch = 1, nq = 1, nk = 1, hq = 1, hkv = 1, d = 1, dv = 1;
  std::vector<std::int32_t> cu_q, cu_k;
  index_t max_q = 0, max_k = 0;
  Buffer q, k, v, o;  // as generated, in float (O: the sentinel)
  std::vector<float> lse;
  LseView lse_view{};
  ForwardOptions opts;
  std::vector<float> slopes, sinks, bias;
  std::unique_ptr<bool[]> mask;
  fuzz::RotaryTables rotary;  // opts.rotary's tables
  bool rotary_must_fail = false;
};

/// Shapes, tensors and options from the input: a valid call (corrupted later, maybe).
void build(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  p.varlen = in.ConsumeBool();
  p.hkv = in.ConsumeIntegralInRange(1, 3);
  p.hq = p.hkv * in.ConsumeIntegralInRange(1, 3);
  p.d = in.ConsumeIntegralInRange(1, 72);
  p.dv = in.ConsumeBool() ? p.d : in.ConsumeIntegralInRange(1, 40);
  if (p.varlen) {
    const index_t seqs = in.ConsumeIntegralInRange(1, 4);
    p.cu_q = {0};
    p.cu_k = {0};
    for (index_t s = 0; s < seqs; ++s) {
      const int lq = in.ConsumeIntegralInRange(0, 24), lk = in.ConsumeIntegralInRange(0, 30);
      p.cu_q.push_back(p.cu_q.back() + lq);
      p.cu_k.push_back(p.cu_k.back() + lk);
      p.max_q = std::max<index_t>(p.max_q, lq);
      p.max_k = std::max<index_t>(p.max_k, lk);
    }
    p.batch = seqs;
    p.nq = std::max<index_t>(p.cu_q.back(), 1);  // packed rows (at least one row of buffer)
    p.nk = std::max<index_t>(p.cu_k.back(), 1);
  } else {
    p.batch = in.ConsumeIntegralInRange(1, 2);
    p.nq = in.ConsumeIntegralInRange(1, 40);
    p.nk = in.ConsumeIntegralInRange(1, 40);
  }
  const index_t vb = p.varlen ? 1 : p.batch;
  p.q = make_tensor(in, vb, p.nq, p.hq, p.d, false, rng);
  p.k = make_tensor(in, vb, p.nk, p.hkv, p.d, !p.varlen, rng);
  p.v = make_tensor(in, vb, p.nk, p.hkv, p.dv, !p.varlen, rng);
  p.o = make_tensor(in, vb, p.nq, p.hq, p.dv, false, rng);
  poison(in, p.q);
  poison(in, p.k);
  poison(in, p.v);
  std::fill(p.o.data.begin(), p.o.data.end(), sentinel);
  p.lse.assign(static_cast<std::size_t>(vb * p.hq * p.nq), sentinel);
  if (in.ConsumeBool()) p.lse_view = make_lse(p.lse.data(), vb, p.hq, p.nq);

  ForwardOptions& o = p.opts;
  o.causal = in.ConsumeBool();
  o.alignment = in.ConsumeBool() ? MaskAlignment::bottom_right : MaskAlignment::top_left;
  o.window_left = window_side(in);
  o.window_right = window_side(in);
  o.attention_chunk = attention_chunk(in);
  o.batch_invariant = in.ConsumeIntegralInRange(0, 3) == 0;
  const float caps[] = {0.0f, 0.0f, 5.0f, 30.0f, std::numeric_limits<float>::max(), 1e-40f};
  o.softcap = caps[in.ConsumeIntegralInRange(0, 5)];
  if (in.ConsumeBool()) o.softmax_scale = in.ConsumeFloatingPointInRange(0.01f, 1.0f);
  const index_t seq_count = p.batch;
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.slopes.resize(static_cast<std::size_t>(in.ConsumeBool() ? p.hq : seq_count * p.hq));
    for (float& s : p.slopes) s = in.ConsumeFloatingPointInRange(0.0f, 2.0f);
    o.alibi_slopes = p.slopes;
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.sinks.resize(static_cast<std::size_t>(p.hq));
    for (float& s : p.sinks) s = in.ConsumeBool() ? -inf : in.ConsumeFloatingPointInRange(-5.0f, 5.0f);
    o.sinks = p.sinks;
  }
  const index_t sq = p.varlen ? p.max_q : p.nq, sk = p.varlen ? p.max_k : p.nk;
  const index_t bb = in.ConsumeBool() ? 1 : seq_count, bh = in.ConsumeBool() ? 1 : p.hq;
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.bias.resize(static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * sk, 1)));
    std::normal_distribution<float> normal;
    for (float& x : p.bias) x = in.ConsumeIntegralInRange(0, 50) == 0 ? nan : normal(rng);
    o.bias = {p.bias.data(), {bb, bh, sq, sk}, {bh * sq * sk, sq * sk, sk, 1}};
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    const auto n = static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * sk, 1));
    p.mask.reset(new bool[n]);
    for (std::size_t i = 0; i < n; ++i) p.mask[i] = (rng() % 4) != 0;
    o.mask = {p.mask.get(), {bb, bh, sq, sk}, {bh * sq * sk, sq * sk, sk, 1}};
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0)  // dropout (p small: O's error bound holds at 1 / (1 - p))
    o.dropout = {in.ConsumeBool() ? 0.1f : 0.25f, rng(), in.ConsumeIntegral<std::uint32_t>()};
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: o.sram_budget_bytes = 0; break;
    case 1: o.sram_budget_bytes = tileattn::test::rows_budget_any(3, p.d, p.dv); break;
    case 2: o.sram_budget_bytes = tileattn::test::rows_budget_any(16, p.d, p.dv); break;
    default: o.sram_budget_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 1u << 20); break;
  }
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[in.ConsumeIntegralInRange(0, 3)];
  if (!backend_available(backend)) backend = Backend::serial;
  o.execution = {backend, in.ConsumeIntegralInRange(0, 3)};
}

// ---- Storage type and final layouts (the trailing bytes) ------------------------------


enum class Storage { fp32, bf16, fp16 };

struct Extension {
  Storage type = Storage::fp32;
  std::array<Relayout, 4> layout{};  // Q, K, V, O
  bool rerun = false;                // run again on `again`; results must be bitwise equal
  Execution again{};
  std::uint8_t rotary = 0;           // item 4 of the file comment
};

/// The trailing bytes' tag (file comment): "ta16" as the four bytes read last-to-first.
constexpr std::uint32_t extension_tag = 0x36316174u;

/// The trailing bytes; without the tag: float, as generated, once.
Extension read_extension(FuzzedDataProvider& in) {
  Extension e;
  if (in.ConsumeIntegral<std::uint32_t>() != extension_tag) return e;
  e.type = static_cast<Storage>(in.ConsumeIntegralInRange(0, 2));
  for (Relayout& r : e.layout) r = relayout_of(in.ConsumeIntegral<std::uint8_t>());
  const auto flags = in.ConsumeIntegral<std::uint8_t>();
  e.rerun = flags & 1;
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[(flags >> 1) & 3];
  if (!backend_available(backend)) backend = Backend::serial;
  e.again = {backend, (flags >> 3) & 3};
  e.rotary = in.ConsumeIntegral<std::uint8_t>();
  return e;
}

/// Sequence b's query count, key count and the view batch and first row of its queries.
struct SequenceRows {
  index_t lq, lk, view_batch, start;
};
SequenceRows sequence_rows(const Problem& p, index_t b) {
  if (!p.varlen) return {p.nq, p.nk, b, 0};
  const auto s = static_cast<std::size_t>(b);
  return {p.cu_q[s + 1] - p.cu_q[s], p.cu_k[s + 1] - p.cu_k[s], 0, p.cu_q[s]};
}

/// Rotary tables for the rotary byte (file comment, item 4), into p.opts.rotary.
void build_rotary(FuzzedDataProvider& in, std::mt19937& rng, Problem& p, std::uint8_t byte) {
  if ((byte & 3) == 0 || (byte & 3) == 3) return;
  bool any = false;
  index_t first = 0, last = 0;
  for (index_t b = 0; b < p.batch; ++b) {
    const SequenceRows s = sequence_rows(p, b);
    if (s.lq == 0) continue;
    const index_t off = p.opts.diagonal(s.lq, s.lk);
    first = any ? std::min(first, off) : off;
    last = any ? std::max(last, off + s.lq - 1) : off + s.lq - 1;
    any = true;
  }
  const bool fit = (byte & 3) == 1;
  if (fit && (p.d < 2 || (any && first < 0))) return;
  index_t half = 1 + (byte >> 2) % std::max<index_t>(p.d / 2, 1);
  index_t rows = (any ? last + 1 : 1) + ((byte >> 5) & 3);
  if (!fit) {
    if (any && first >= 0 && last >= 1) rows = last;  // the last position past the tables
    else if (!any || first >= 0) half = p.d / 2 + 1;  // (a negative position fails anyway)
  }
  p.rotary = fuzz::make_rotary_tables(in, rng, rows, half);
  p.opts.rotary = p.rotary.options;
  p.rotary_must_fail = !fit;
}

/// Q's float mirror rotated as the kernel rotates it (options.rotary), rounded to T.
template <class T>
void rotate_queries(const Problem& p, const TensorView<float>& q) {
  const RotaryOptions& r = p.opts.rotary;
  if (!r.enabled()) return;
  std::vector<float> row(static_cast<std::size_t>(p.d));
  for (index_t b = 0; b < p.batch; ++b) {
    const SequenceRows s = sequence_rows(p, b);
    const index_t off = p.opts.diagonal(s.lq, s.lk);
    for (index_t i = 0; i < s.lq; ++i)
      for (index_t h = 0; h < p.hq; ++h) {
        for (index_t x = 0; x < p.d; ++x) row[static_cast<std::size_t>(x)] = q(s.view_batch, s.start + i, h, x);
        fuzz::rotate_reference<T>(r, row.data(), i + off);
        for (index_t x = 0; x < p.d; ++x) q(s.view_batch, s.start + i, h, x) = row[static_cast<std::size_t>(x)];
      }
  }
}


template <class T>
struct Typed {
  Stored<T> q, k, v, o;
};

// ---- Bad arguments, the call, the checks ----------------------------------------------

/// One bad argument (or none): the call must then throw invalid_argument, writing nothing.
/// Chosen (one input byte) before the trailing bytes are read, applied to the final views.
int choose_corruption(FuzzedDataProvider& in) { return in.ConsumeIntegralInRange(0, 24); }

template <class T>
void corrupt(int choice, Problem& p, Typed<T>& t) {
  // Two rows this far apart span 2^63 bytes or more: past PTRDIFF_MAX, whatever the type.
  // (A stride whose span fits is a valid view of a buffer that large: a 16-bit K with
  // stride 2^61 spans 2^62 bytes, passes every check, and reads there.)
  constexpr auto stride_past_ptrdiff_max = static_cast<index_t>((std::uint64_t{1} << 63) / sizeof(T));
  switch (choice) {
    case 0: t.k.view.shape[3] += 1; break;                                  // head_dim mismatch
    case 1: t.o.view.stride[1] = -1; break;                                 // negative stride
    case 2: t.q.view.shape[1] = index_t{1} << 62; break;                     // element count overflow
    case 3: t.k.view.stride[1] = stride_past_ptrdiff_max; break;            // address range overflow
    case 4: t.o.view.data = t.q.view.data; break;                           // O aliases Q
    case 5: p.opts.softmax_scale = -1.0f; break;
    case 6: p.opts.softmax_scale = nan; break;
    case 7: (p.nq % 2 ? p.opts.window_left : p.opts.attention_chunk) = -3; break;
    case 8: p.opts.softcap = inf; break;
    case 9: p.opts.sram_budget_bytes = std::size_t{1} << 40; break;
    case 10: p.opts.execution.num_threads = 100000; break;
    case 11: t.q.view.data = nullptr; break;
    case 12: t.v.view.shape[2] += 1; break;                                 // heads mismatch
    case 13: p.opts.sram_budget_bytes = 64; break;                          // below 1 x 1 tiles
    case 14:
      if (p.varlen && p.cu_q.size() > 2) std::swap(p.cu_q[1], p.cu_q[2]);   // maybe decreasing
      break;
    case 15:
      if (p.varlen) p.cu_k.back() += 5;                                     // past the buffer
      break;
    case 16: p.sinks.assign(1, 0.0f), p.opts.sinks = p.sinks; break;        // wrong count (unless hq == 1)
    case 17: p.opts.dropout.p = 1.0f; break;                                 // dropout.p outside [0, 1)
    default: break;  // no corruption
  }
}

template <class T>
std::string layout_of(const char* name, const Stored<T>& s, const Relayout& r) {
  std::string out = std::string(" ") + name + (r.fresh ? std::string(" ") + order_names[r.order] : std::string(" gen")) +
                    " +" + std::to_string(r.shift) + " @" +
                    std::to_string(reinterpret_cast<std::uintptr_t>(s.view.data) % 64) + " strides";
  for (index_t x : s.view.stride) out += " " + std::to_string(x);
  return out;
}

/// What the failing input asked for, printed with a failure.
template <class T>
std::string describe(const Problem& p, const Typed<T>& t, const Extension& e) {
  const ForwardOptions& o = p.opts;
  std::string s = std::string(type_name<T>()) + " " + (p.varlen ? "varlen" : "fixed") + std::string(" B ") +
                  std::to_string(p.batch) + " Nq " + std::to_string(p.nq) + " Nk " + std::to_string(p.nk) + " H " +
                  std::to_string(p.hq) + "/" + std::to_string(p.hkv) + " d " + std::to_string(p.d) + " dv " +
                  std::to_string(p.dv) + " causal " + std::to_string(o.causal) + " top_left " +
                  std::to_string(o.alignment == MaskAlignment::top_left) + " window " +
                  std::to_string(o.window_left) + "," + std::to_string(o.window_right) + " chunk " +
                  std::to_string(o.attention_chunk) + (o.batch_invariant ? " batch_invariant" : "") + " softcap " +
                  std::to_string(o.softcap) + " scale " + (o.softmax_scale ? std::to_string(*o.softmax_scale) : "default") +
                  " dropout " + std::to_string(o.dropout.p) + "/" + std::to_string(o.dropout.seed) + "/" +
                  std::to_string(o.dropout.offset) +
                  " alibi " + std::to_string(p.slopes.size()) + " sinks " + std::to_string(p.sinks.size()) +
                  " bias " + std::to_string(p.bias.size()) + " mask " + std::to_string(p.mask != nullptr) +
                  " budget " + std::to_string(o.sram_budget_bytes) + " backend " + to_string(o.execution.backend) +
                  " x " + std::to_string(o.execution.num_threads) + " lse " + std::to_string(p.lse_view.data != nullptr) +
                  " rotary " + p.rotary.describe() + (p.rotary_must_fail ? " (does not fit)" : "");
  if (p.varlen) {
    s += " cu_q";
    for (auto x : p.cu_q) s += " " + std::to_string(x);
    s += " cu_k";
    for (auto x : p.cu_k) s += " " + std::to_string(x);
  }
  s += "\n  layouts:" + layout_of("q", t.q, e.layout[0]) + ";" + layout_of("k", t.k, e.layout[1]) + ";" +
       layout_of("v", t.v, e.layout[2]) + ";" + layout_of("o", t.o, e.layout[3]);
  if (e.rerun)
    s += "\n  rerun on " + std::string(to_string(e.again.backend)) + " x " + std::to_string(e.again.num_threads);
  return s;
}

Deviation check_against_reference(const Problem& p, const TensorView<float>& q, const TensorView<float>& k,
                                  const TensorView<float>& v, const TensorView<float>& o) {
  const reference::Options ro = reference::Options::from(p.opts);
  if (!p.varlen) {
    const auto ref = reference::attention<float>(q, k, v, ro);
    return test::compare_to_reference(ref, o, p.lse_view);
  }
  Deviation all;
  for (std::size_t b = 0; b + 1 < p.cu_q.size(); ++b) {
    reference::Options rb = ro;
    rb.batch_index = static_cast<index_t>(b);
    const auto seq = [&](const TensorView<float>& t, index_t start, index_t len) {
      return reference::sequence_view<float>(
          StridedView<const float, 3>{t.data, {t.shape[1], t.shape[2], t.shape[3]},
                                      {t.stride[1], t.stride[2], t.stride[3]}},
          start, len);
    };
    const index_t lq = p.cu_q[b + 1] - p.cu_q[b], lk = p.cu_k[b + 1] - p.cu_k[b];
    const auto ref = reference::attention<float>(seq(q, p.cu_q[b], lq), seq(k, p.cu_k[b], lk),
                                                 seq(v, p.cu_k[b], lk), rb);
    const LseView lse = p.lse_view.data ? LseView{p.lse_view.data + p.cu_q[b], {1, p.hq, lq}, {0, p.nq, 1}} : LseView{};
    const Deviation d = test::compare_to_reference(ref, seq(o, p.cu_q[b], lq), lse);
    all.o = std::max(all.o, d.o);
    all.lse = std::max(all.lse, d.lse);
    if (all.problem.empty()) all.problem = d.problem;
  }
  return all;
}

template <class T>
void run(Problem& p, const Typed<T>& t, const ForwardOptions& opts) {
  if (!p.varlen) {
    forward(t.q.view, t.k.view, t.v.view, t.o.view, p.lse_view, opts);
    return;
  }
  const auto packed = [](const TensorView<T>& v) {
    return StridedView<T, 3>{v.data, {v.shape[1], v.shape[2], v.shape[3]}, {v.stride[1], v.stride[2], v.stride[3]}};
  };
  const PackedLseView lse = p.lse_view.data ? make_packed_lse(p.lse.data(), p.hq, p.nq) : PackedLseView{};
  forward_varlen(packed(t.q.view), packed(t.k.view), packed(t.v.view), packed(t.o.view), lse,
                 {p.cu_q, p.cu_k, p.max_q, p.max_k}, opts);
}

/// The error bound on O for storage type T (file comment): max_v = max |V| (finite).
template <class T>
double o_bound(double max_v) {
  if constexpr (std::is_same_v<T, bf16>) return 1e-4 + 0x1p-7 * max_v;
  else if constexpr (std::is_same_v<T, fp16>) return 1e-4 + 0x1p-10 * max_v;
  else return 1e-4;
}
constexpr double lse_bound = 1e-4;

/// Everything after build(): the final views in type T, the corruption, the call, the checks.
template <class T>
void execute(Problem& p, int corruption, const Extension& e, bool verbose) {
  const T gap = from_float<T>(nan), o_sentinel = from_float<T>(sentinel);
  Typed<T> t{make_stored<T>(p.q, e.layout[0], gap), make_stored<T>(p.k, e.layout[1], gap),
             make_stored<T>(p.v, e.layout[2], gap), make_stored<T>(p.o, e.layout[3], o_sentinel)};
  corrupt(corruption, p, t);
  if (verbose) std::fprintf(stderr, "forward_fuzz: corruption %d: %s\n", corruption, describe(p, t, e).c_str());
  try {
    run(p, t, p.opts);
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("forward_fuzz", err);
    if (!all_bits_equal(t.o.data, o_sentinel) || !test::all_equal(p.lse, sentinel))
      fail(std::string("wrote outputs before throwing: ") + err.what() + "\n  " + describe(p, t, e));
    return;
  }
  if (p.rotary_must_fail) fail("accepted rotary tables that do not fit\n  " + describe(p, t, e));
  const Buffer q = mirror(t.q), k = mirror(t.k), v = mirror(t.v), o = mirror(t.o);
  rotate_queries<T>(p, q.view);
  const Deviation dev = check_against_reference(p, q.view, k.view, v.view, o.view);
  if (!dev.problem.empty()) fail("differs from the reference: " + dev.problem + "\n  " + describe(p, t, e));
  double max_v = 0.0;
  test::for_each_index(v.view.shape, [&](index_t b, index_t n, index_t h, index_t c) {
    if (const float x = v.view(b, n, h, c); std::isfinite(x)) max_v = std::max(max_v, std::abs(static_cast<double>(x)));
  });
  if (verbose)
    std::fprintf(stderr, "forward_fuzz: error %.3g on O (bound %.3g), %.3g on LSE\n", dev.o, o_bound<T>(max_v), dev.lse);
  if (dev.o > o_bound<T>(max_v) || dev.lse > lse_bound)
    fail("error " + std::to_string(dev.o) + " on O (bound " + std::to_string(o_bound<T>(max_v)) + "), " +
         std::to_string(dev.lse) + " on LSE\n  " + describe(p, t, e));
  // Nothing written outside the views; nor, in a varlen buffer, past the last sequence.
  if (const std::size_t n = changed_outside(t.o.view, t.o.data, o_sentinel))
    fail(std::to_string(n) + " elements of O's buffer outside its view were written\n  " + describe(p, t, e));
  if (!p.lse_view.data && !test::all_equal(p.lse, sentinel))
    fail("wrote an LSE that was not asked for\n  " + describe(p, t, e));
  if (p.varlen && p.cu_q.back() < p.nq) {
    const index_t end = p.cu_q.back(), rows = p.nq - end;
    const TensorView<T> tail{t.o.view.data + end * t.o.view.stride[1], {1, rows, p.hq, p.dv}, t.o.view.stride};
    bool written = false;
    test::for_each_index(tail.shape, [&](index_t b, index_t n, index_t h, index_t c) {
      written |= std::memcmp(&tail(b, n, h, c), &o_sentinel, sizeof(T)) != 0;
    });
    for (index_t h = 0; h < p.hq; ++h)
      for (index_t i = end; i < p.nq; ++i)
        written |= std::memcmp(&p.lse[static_cast<std::size_t>(h * p.nq + i)], &sentinel, sizeof(float)) != 0;
    if (written) fail("wrote O or LSE rows past cu_seqlens_q's end\n  " + describe(p, t, e));
  }
  if (!e.rerun) return;
  // Execution promises bitwise-identical results for every backend and thread count.
  const std::vector<T> first_o = t.o.data;
  const std::vector<float> first_lse = p.lse;
  std::fill(t.o.data.begin(), t.o.data.end(), o_sentinel);
  std::fill(p.lse.begin(), p.lse.end(), sentinel);
  ForwardOptions again = p.opts;
  again.execution = e.again;
  run(p, t, again);
  if (std::memcmp(first_o.data(), t.o.data.data(), first_o.size() * sizeof(T)) != 0 || !test::bitwise_equal(first_lse, p.lse))
    fail("results differ between executions\n  " + describe(p, t, e));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool verbose = std::getenv("FORWARD_FUZZ_VERBOSE") != nullptr;
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  Problem p;
  build(in, p, rng);
  const int corruption = choose_corruption(in);
  if (verbose) std::fprintf(stderr, "forward_fuzz: %zu of %zu bytes left for the trailing ones\n", in.remaining_bytes(), size);
  const Extension e = read_extension(in);
  build_rotary(in, rng, p, e.rotary);
  switch (e.type) {
    case Storage::fp32: execute<float>(p, corruption, e, verbose); break;
    case Storage::bf16: execute<bf16>(p, corruption, e, verbose); break;
    case Storage::fp16: execute<fp16>(p, corruption, e, verbose); break;
  }
  return 0;
}
