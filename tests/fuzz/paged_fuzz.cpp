// tests/fuzz/paged_fuzz.cpp: libFuzzer harness for the paged-KV attention entry points of
// tileattn/paged.hpp: forward_paged (with and without the LSE), forward_paged_varlen,
// plan_forward_paged / plan_forward_paged_varlen and the forward_paged(plan, ...) overloads.
//
// The fuzzer's bytes choose the batch (1 to 4 sequences), each sequence's cache_seqlens
// (0 to 60, empty sequences included) and query count (fixed: 1 to 12, decode to chunked
// prefill; varlen: 0 to 12 per sequence, packed through cu_seqlens_q, spare rows after the
// last), heads (GQA groups), head_dim and head_dim_v apart, the page size (1, 3, 5, 16, 17
// or any of 1 to 20), a pool of shuffled pages with 0 to 3 spare ones and the unused rows of
// a sequence's last page all NaN, full pages of sequence 0 shared by the others (a prefix
// cache), a block table in one of four layouts whose unused entries hold ids outside the
// pool (the docs say they are never read), every layout of Q, O and the pools (four
// dimension orders, padding, innermost stride 2, misaligned starts; gaps hold NaN in inputs
// and the sentinel in O), a strided or contiguous LSE or none, every option (causal and both
// alignments, windows, attention chunks, softcap, scale, ALiBi, sinks, bias, mask, num_splits
// (and batch_invariant where it is 0 or 1) with SRAM budgets small enough that 60-key
// sequences really split, or INT64_MAX, backend and thread count, prefix-once on or off with
// thresholds low enough that sequence 0's shared pages group), NaN
// and Inf at chosen Q/K/V elements, and the storage types: K/V pools in float, bf16, fp16
// (Q alike) or 8-bit (int8, fp8 e4m3, fp8 e5m2 with float Q; int8 with bf16 Q too:
// execute_q says why) with PagedOptions::k_scale / v_scale per tensor, per K/V head, per
// page or per (page, head), padded or not, whose values may be negative, zero or NaN
// (allowed: params.hpp says a non-finite scale makes the values it scales non-finite), and
// 4-bit block pools (q4_0 and NVFP4, float Q; head_dim and head_dim_v rounded to whole
// blocks; a NaN poisoned into a block makes the whole block NaN, as the codec says; and,
// only after the 4-bit tag below, MXFP4 and the Hadamard-rotated pools), and
// rotary embedding of Q (a quarter of the inputs: tables of random sizes in either layout,
// NeoX or interleaved pairs, now and then a NaN entry; the reference rotates Q first), and in
// a quarter of the other calls with dv <= d and no rotary, MLA (tileattn/mla.hpp:
// forward_paged_mla(_varlen) and its plans) with V the K pool's first dv columns.
// A quarter of the inputs call forward_paged_topk / forward_paged_topk_varlen (topk.hpp)
// instead (never with MLA): 1 to 70 indices per query row, each -1 (padding) or any key of
// its sequence, duplicates included, without the options top-k rejects (ALiBi, bias, mask,
// rotary) or a plan; each query row's reference is the double attention over its list
// itself (a duplicate twice), with a mask hiding padding and the keys its causal mask,
// window or chunk hides at their own positions (check_topk_row). Their own corruptions: an
// index outside [-1, cache_seqlens), an indices view of the wrong shape (a plan mismatch
// becomes one of these).
// Then one corruption from the list in corrupt() (or none): a page id outside the pool in a
// used entry, cache_seqlens beyond the table, negative or of the wrong count, mismatched
// heads and head dims, scale views of the wrong extent or on 16/32-bit pools, a plan made
// for another call, null data, bad options, bad cu_seqlens_q, aliasing outputs, negative or
// overflowing strides, a pool of no pages of INT64_MAX keys, rotary tables that do not fit
// (a position short, too wide, one missing, two shapes, a negative stride, on O), ...
//
// Every corruption makes the call invalid, so it must throw tileattn::invalid_argument
// naming its parameter, with O and the LSE bitwise their sentinel and both pools
// unchanged; a call without one must succeed (a random SRAM budget may be too small for any
// tile: budget_error is accepted there). In planned mode the plan is made from the valid
// call, then plan_forward_paged(_varlen) and forward_paged(plan, ...) both run on the corrupted one.
// A successful call must match the double-precision reference (tests/reference) over each
// sequence's K/V gathered from its pages through the block table (8-bit: dequantized with
// the scales, as quantized_kv_test.cpp does), NaN rows and rows without keys included; write
// nothing outside O's and the LSE's views, nor O rows or LSE entries past cu_seqlens_q's
// end; and, when the flags byte asks, give the same bits on another backend and thread
// count, with the plan made separately where the first call made it inline or the reverse
// (Execution promises bitwise-identical results).
// Anything else aborts (a crash, a sanitizer report, another exception, a wrong result).
//
// The 4-bit tag (issue #42 item 7): an input whose first bytes are "tp4h" (libFuzzer finds
// the constant through its comparison tracing) reads the byte after them as the 4-bit
// variant of a 4-bit problem: a q4_0 one becomes q4_0, MXFP4 (the same 32-value blocks),
// hadamard_rotated<q4_0> or hadamard_rotated<mxfp4>, an NVFP4 one NVFP4 or
// hadamard_rotated<nvfp4> (0, 1, 2, 3 mod 4 / 0, 1 mod 2). Rotated pools hold each row turned
// by H before it was quantized; their reference is attention over the dequantized rows as
// stored with each Q row (after rotary) turned by H, its O turned back by H in double (H is
// its own inverse, so over finite values this is attention over the rows turned back; and a
// non-finite Q element reaches all of H q, as in the kernel: an Inf in Q makes its row's
// scores NaN over rotated pools); head dims that are not powers of two (NVFP4's 48) stay
// unrotated. Those bytes are read apart from the FuzzedDataProvider (which takes integers
// from the input's end), so inputs without the tag decode as they did before it.
//
// The tree tag (issue #42 item 7): an input that starts with "tptr" is a speculative verify
// step instead, decoded from the bytes after the tag by a provider of its own (so, again,
// no other input changes meaning): forward_paged_flex or forward_paged_flex_varlen
// (flex.hpp) under draft_tree_mask (flex/tree_mask.hpp), float Q and pools, 1 to 3
// sequences of 0 to 60 accepted positions plus the same 1 to 20 drafts each (cache_seqlens
// count both; one query per draft, varlen with spare rows), one tree or one per sequence of
// random parents (forests, chains), block sizes from 1x1 up, and the pools, layouts and
// options of the other inputs but the mask (bias, ALiBi, sinks, softcap, causal, windows,
// chunks, rotary, splits, budgets, backends, NaN/Inf). A successful call must match the
// double reference with the same options and the tree as a dense boolean mask, built by
// walking the parent array (tests/flex/flex_paged_test.cpp's TreeVerify), under the float
// bounds below, and give the same bits on a rerun when the flags byte asks. Half the
// corruptions are the mask's: draft_tree_mask's own bad arguments (a parent not an earlier
// token or below -1, the wrong parent count, tokens < 1, fewer keys than drafts, no
// sequences) must throw naming their parameter; a valid mask made for another call (other
// cache_seqlens, a smaller or larger batch, another draft count) must make the call throw
// naming block_mask with O and the LSE untouched. The other half are corrupt()'s bad
// arguments of the call (a plan mismatch excepted: flex calls take no plan).
//
// Bounds: values are N(0, 1) (8-bit: quantized at scales that keep them so), softmax scales
// up to 1, d up to 72, as in forward_fuzz. Float Q: the forward's 1e-4 absolute on O and the
// LSE (the suite's 2e-5 bound with forward_fuzz's margin for its wider options); 8-bit K/V
// with float Q are converted exactly and multiplied in fp32 with the scales applied to score
// and probability columns (precision.md), so the same bound holds over the dequantized
// values. bf16 Q (bf16 pair tiles on the packed path) rounds P V's probabilities (times the V
// scale) to bf16 and O once: 1e-4 + 2^-7 max|V|. fp16 Q only rounds O: 1e-4 + 2^-10 max|V|.
// max|V| is over the finite dequantized V values the sequences use. The LSE is float in
// every type: 1e-4.
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target paged_fuzz
//   build-fuzz/tests/fuzz/paged_fuzz tests/fuzz/corpus/paged -max_len=512 -max_total_time=3600
// PAGED_FUZZ_VERBOSE=1 prints what each input decodes to and how the call ended:
// build-fuzz/tests/fuzz/paged_fuzz FILE...  (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz/fuzz_layouts.hpp"
#include "fuzz/fuzz_rotary.hpp"
#include "fuzz/fuzz_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/flex.hpp"
#include "tileattn/paged.hpp"
#include "tileattn/topk.hpp"

namespace {

using namespace tileattn;
using fuzz::orders;
using fuzz::Relayout;
using fuzz::relayout_of;
using tileattn::test::Deviation;
using tileattn::test::sentinel;

using fuzz::all_bits_equal;
using fuzz::inf;
using fuzz::nan;
using fuzz::same_bits;
using fuzz::attention_chunk;
using fuzz::window_side;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("paged_fuzz", what); }

// ---- Storage types ----------------------------------------------------------------------

enum class KvType { fp32, bf16, fp16, int8, e4m3, e5m2, q4_0, nvfp4 };
/// A 4-bit problem's variant (the 4-bit tag, file comment): its block and whether rotated.
enum class FourBit { as_drawn, mxfp4, rotated_q4_0, rotated_mxfp4, rotated_nvfp4 };
constexpr const char* four_bit_names[] = {"", " as mxfp4", " as hadamard_rotated<q4_0>", " as hadamard_rotated<mxfp4>",
                                          " as hadamard_rotated<nvfp4>"};
enum class QType { fp32, bf16, fp16 };
constexpr const char* kv_names[] = {"float", "bf16", "fp16", "int8", "fp8_e4m3", "fp8_e5m2", "q4_0", "nvfp4"};
/// The 8-bit types (scales beside the pools); q4_0 and nvfp4 are 4-bit blocks (scales inside).
bool eight_bit(KvType t) { return t >= KvType::int8 && t <= KvType::e5m2; }
bool four_bit(KvType t) { return t >= KvType::q4_0; }
constexpr const char* q_names[] = {"float", "bf16", "fp16"};

/// A float stored as K/V type KV: 8-bit types quantized at the write scale w (> 0).
template <class KV>
KV store_kv(float x, float w) {
  if constexpr (quantized_type<KV>) return quantize<KV>(x, w);
  else return from_float<KV>(x);
}

/// A stored K/V value as the kernel means it: 8-bit ones times their scale.
template <class KV>
float load_kv(KV x, float scale) {
  if constexpr (quantized_type<KV>) return to_float(x) * scale;
  else return to_float(x);
}

/// The scale that makes an 8-bit type hold N(0, 1) values well (quantized_kv_test's).
float natural_scale(KvType t) { return t == KvType::int8 ? 4.0f / int8_max : 1.0f; }

// ---- Layouts ----------------------------------------------------------------------------

/// The names of fuzz::orders (fuzz_layouts.hpp) for Q, O and the pools, in failure
/// messages: 0213 puts a pool's heads outside its page's rows, 0231 dimension 1 innermost.
constexpr const char* order_names[] = {"0123", "0213", "0231", "1032"};

/// A tensor in type T: its buffer and its view.
template <class T>
struct Stored {
  std::vector<T> data;
  TensorView<T> view;
};

/// A [shape] tensor laid out as `r` says, element (a, b, c, d) = value(a, b, c, d); every
/// buffer element outside the view holds `gap`.
template <class T, class F>
Stored<T> lay_out(const std::array<index_t, 4>& shape, const Relayout& r, T gap, F&& value) {
  Stored<T> s;
  std::array<index_t, 4> stride{};
  const std::array<int, 4>& order = r.fresh ? orders[static_cast<std::size_t>(r.order)] : orders[0];
  index_t span = r.fresh ? r.inner_stride : 1, last = 0;
  for (int i = 3; i >= 0; --i) {
    const int d = order[static_cast<std::size_t>(i)];
    stride[d] = span;
    span = span * shape[d] + (r.fresh ? r.pad : 0);
    last += std::max<index_t>(shape[d] - 1, 0) * stride[d];
  }
  const auto shift = static_cast<std::size_t>(r.shift);
  s.data.assign(static_cast<std::size_t>(last + 1) + shift, gap);
  s.view = {s.data.data() + shift, shape, stride};
  test::for_each_index(shape, [&](index_t a, index_t b, index_t c, index_t d) { s.view(a, b, c, d) = value(a, b, c, d); });
  return s;
}

std::string describe_layout(const char* name, const Relayout& r, const index_t* stride) {
  std::string out = std::string(" ") + name + (r.fresh ? std::string(" ") + order_names[r.order] : std::string(" gen")) +
                    " +" + std::to_string(r.shift) + " strides";
  for (int d = 0; d < 4; ++d) out += " " + std::to_string(stride[d]);
  return out;
}

// ---- The problem, type-independent ------------------------------------------------------

/// Scale granularity of an 8-bit pool (KvScaleView [num_pages or 1, heads_kv or 1]).
enum class Granularity { none, tensor, head, page, page_head };
constexpr const char* granularity_names[] = {"none", "tensor", "head", "page", "page_head"};

/// The scales of one 8-bit pool: what the kernel is given and what the values were written at.
struct Scales {
  Granularity kind = Granularity::none;
  std::vector<float> data;  // the view's buffer
  KvScaleView view{};
  std::vector<float> write;  // [num_pages, heads_kv]: the scale each value was quantized at

  /// The scale the kernel applies to (page, head): 1 without a view.
  float at(index_t page, index_t h) const {
    if (!view.data) return 1.0f;
    return view(view.shape[0] == 1 ? 0 : page, view.shape[1] == 1 ? 0 : h);
  }
};

struct Problem {
  KvType kv = KvType::fp32;
  FourBit four_bit = FourBit::as_drawn;  // the 4-bit tag's variant (q4_0 and nvfp4 problems)
  QType qt = QType::fp32;
  bool varlen = false, lse_on = false, planned = false;
  index_t batch = 1, hq = 1, hkv = 1, d = 1, dv = 1, page = 1;
  index_t nq = 1;                          // fixed: queries per sequence; varlen: packed rows
  std::vector<std::int32_t> seqlens, cu;   // cache_seqlens; cu_seqlens_q (varlen)
  index_t longest_q = 0, longest_k = 0;
  index_t num_pages = 0, max_pages = 0;
  bool share = false;                      // sequences b > 0 share sequence 0's full pages
  std::vector<std::int32_t> table;         // the block table's buffer (unused entries poisoned)
  BlockTableView table_view{};
  int table_layout = 0;
  std::int32_t table_poison = 0;
  std::vector<float> qf;                   // Q, contiguous [view batch, nq, hq, d]
  std::vector<float> kf, vf;               // pools in float, contiguous [pages, page, hkv, d(v)]
  Scales ks, vs;                           // 8-bit pools only
  std::array<Relayout, 4> layout{};        // Q, K pool, V pool, O
  int lse_layout = 0;                      // 0 contiguous, 1 every other element
  PagedOptions opts;
  std::vector<float> slopes, sinks, bias;
  std::unique_ptr<bool[]> mask;
  int budget_kind = 0;                     // 3: a random budget (may fit no tile)
  bool rerun = false, rerun_toggles_plan = false;
  Execution again{};
  int corruption = -1;                     // chosen; applied_corruption says what it became
  std::string applied = "none";
  fuzz::RotaryTables rotary;               // opts.rotary's tables (none: no rotation)
  bool mla = false;                        // forward_paged_mla: V the K pool's first dv columns
  bool topk = false;                       // forward_paged_topk(_varlen)
  index_t topk_k = 0;
  std::vector<std::int32_t> topk_idx;      // [view batch x nq rows, topk_k]
};

index_t view_batch(const Problem& p) { return p.varlen ? 1 : p.batch; }

/// Up to three NaN or Inf values at chosen elements of `data` (when the input asks).
void poison(FuzzedDataProvider& in, std::vector<float>& data, const std::vector<std::size_t>& allowed) {
  const int count = in.ConsumeIntegralInRange(0, 3) * (in.ConsumeIntegralInRange(0, 7) == 0);
  const float values[] = {nan, inf, -inf};
  for (int i = 0; i < count && !allowed.empty(); ++i)
    data[allowed[in.ConsumeIntegralInRange<std::size_t>(0, allowed.size() - 1)]] = values[in.ConsumeIntegralInRange(0, 2)];
}

/// Sequences: cache_seqlens and query lengths (cu_seqlens_q for varlen).
void build_sequences(FuzzedDataProvider& in, Problem& p) {
  p.batch = in.ConsumeIntegralInRange(1, 4);
  const index_t max_q = in.ConsumeBool() ? 1 : 12;  // decoding often, verify and prefill chunks too
  p.cu = {0};
  for (index_t b = 0; b < p.batch; ++b) {
    const int len = in.ConsumeIntegralInRange(0, 5) == 0 ? 0 : in.ConsumeIntegralInRange(1, 60);
    p.seqlens.push_back(len);
    p.longest_k = std::max<index_t>(p.longest_k, len);
    if (p.varlen) {
      const int lq = in.ConsumeIntegralInRange<int>(0, static_cast<int>(max_q));
      p.cu.push_back(p.cu.back() + lq);
      p.longest_q = std::max<index_t>(p.longest_q, lq);
    }
  }
  if (p.varlen) {
    p.nq = p.cu.back() + in.ConsumeIntegralInRange(0, 2);  // spare rows past the last sequence
  } else {
    p.nq = in.ConsumeIntegralInRange<index_t>(1, max_q);
    p.longest_q = p.nq;
  }
}

/// The pool, the shuffled block table (shared prefix pages, poisoned unused entries) and
/// the float K/V values: used rows N(0, 1), everything else NaN.
void build_pages(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  const index_t sizes[] = {1, 3, 5, 16, 17};
  p.page = in.ConsumeBool() ? sizes[in.ConsumeIntegralInRange(0, 4)] : in.ConsumeIntegralInRange(1, 20);
  p.share = in.ConsumeIntegralInRange(0, 3) == 0;
  const index_t P = p.page, B = p.batch;
  const index_t shared = p.share ? p.seqlens[0] / P : 0;  // sequence 0's full pages
  index_t distinct = 0;
  for (index_t b = 0; b < B; ++b) {
    const index_t pages = (p.seqlens[static_cast<std::size_t>(b)] + P - 1) / P;
    p.max_pages = std::max(p.max_pages, pages);
    distinct += b == 0 ? pages : pages - std::min(pages, shared);
  }
  p.max_pages += in.ConsumeIntegralInRange(0, 2);  // padding columns
  p.num_pages = distinct + in.ConsumeIntegralInRange(0, 3);  // spare pages
  const std::int32_t poisons[] = {-1, INT_MIN, static_cast<std::int32_t>(p.num_pages), INT_MAX, 1 << 30};
  p.table_poison = poisons[in.ConsumeIntegralInRange(0, 4)];
  p.table_layout = in.ConsumeIntegralInRange(0, 3);
  const index_t M = p.max_pages;
  switch (p.table_layout) {
    case 0: p.table.assign(static_cast<std::size_t>(std::max<index_t>(B * M, 1)), p.table_poison);
            p.table_view = make_block_table(p.table.data(), B, M); break;
    case 1: p.table.assign(static_cast<std::size_t>(B * (M + 3)), p.table_poison);  // padded rows
            p.table_view = {p.table.data(), {B, M}, {M + 3, 1}}; break;
    case 2: p.table.assign(static_cast<std::size_t>(std::max<index_t>(B * M, 1)), p.table_poison);  // column-major
            p.table_view = {p.table.data(), {B, M}, {1, B}}; break;
    default: p.table.assign(static_cast<std::size_t>(std::max<index_t>(2 * B * M, 1)), p.table_poison);  // every other
             p.table_view = {p.table.data(), {B, M}, {2 * M, 2}}; break;
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(p.num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::size_t next = 0;
  const auto entry = [&](index_t b, index_t j) -> std::int32_t& {
    return p.table[static_cast<std::size_t>(b * p.table_view.stride[0] + j * p.table_view.stride[1])];
  };
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j * P < p.seqlens[static_cast<std::size_t>(b)]; ++j)
      entry(b, j) = b > 0 && j < shared ? entry(0, j) : order[next++];
  std::normal_distribution<float> normal;
  p.kf.assign(static_cast<std::size_t>(p.num_pages * P * p.hkv * p.d), nan);
  p.vf.assign(static_cast<std::size_t>(p.num_pages * P * p.hkv * p.dv), nan);
  std::vector<std::size_t> used_k, used_v;  // elements the sequences read
  for (index_t b = 0; b < B; ++b)
    for (index_t r = 0; r < p.seqlens[static_cast<std::size_t>(b)]; ++r) {
      const index_t row = entry(b, r / P) * P + r % P;
      for (index_t i = 0; i < p.hkv * p.d; ++i) {
        const auto at = static_cast<std::size_t>(row * p.hkv * p.d + i);
        p.kf[at] = normal(rng);
        used_k.push_back(at);
      }
      for (index_t i = 0; i < p.hkv * p.dv; ++i) {
        const auto at = static_cast<std::size_t>(row * p.hkv * p.dv + i);
        p.vf[at] = normal(rng);
        used_v.push_back(at);
      }
    }
  poison(in, p.kf, used_k);
  poison(in, p.vf, used_v);
}

/// An 8-bit pool's scales: a granularity, a padded or packed view, values near the natural
/// scale and now and then negative, zero, NaN or a power of two; unused pages' entries NaN.
void build_scales(FuzzedDataProvider& in, Problem& p, Scales& s, std::mt19937& rng) {
  const float natural = natural_scale(p.kv);
  s.kind = static_cast<Granularity>(in.ConsumeIntegralInRange(0, 4));
  s.write.assign(static_cast<std::size_t>(p.num_pages * p.hkv), s.kind == Granularity::none ? 1.0f : natural);
  if (s.kind == Granularity::none) return;
  const bool per_page = s.kind == Granularity::page || s.kind == Granularity::page_head;
  const bool per_head = s.kind == Granularity::head || s.kind == Granularity::page_head;
  const index_t rows = per_page ? p.num_pages : 1, cols = per_head ? p.hkv : 1;
  const index_t pad = in.ConsumeIntegralInRange(0, 2), row_stride = cols + pad;
  s.data.assign(static_cast<std::size_t>(std::max<index_t>(rows * row_stride, 1)), nan);
  // Broadcast extents may carry any stride (the library reads index 0 only).
  s.view = {s.data.data(), {rows, cols}, {rows == 1 ? 5 : row_stride, cols == 1 ? 3 : 1}};
  std::vector<bool> used(static_cast<std::size_t>(std::max<index_t>(p.num_pages, 1)), false);
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t j = 0; j * p.page < p.seqlens[static_cast<std::size_t>(b)]; ++j)
      used[static_cast<std::size_t>(p.table[static_cast<std::size_t>(b * p.table_view.stride[0] + j * p.table_view.stride[1])])] = true;
  std::uniform_real_distribution<float> jitter(0.5f, 2.0f);
  const int odd = in.ConsumeIntegralInRange(0, 3) == 0 ? in.ConsumeIntegralInRange(1, 4) : 0;  // which odd values
  for (index_t r = 0; r < rows; ++r) {
    if (per_page && !used[static_cast<std::size_t>(r)]) continue;  // stays NaN: never read
    for (index_t c = 0; c < cols; ++c) {
      float x = natural * jitter(rng);
      if (odd && rng() % 4 == 0) {
        switch (odd) {
          case 1: x = -x; break;
          case 2: x = 0.0f; break;
          case 3: x = nan; break;
          default: x = std::exp2(std::round(std::log2(x))); break;
        }
      }
      s.data[static_cast<std::size_t>(r * row_stride + c)] = x;
    }
  }
  // The write scale: the kernel's where it is a usable one, else the natural scale.
  for (index_t page = 0; page < p.num_pages; ++page)
    for (index_t h = 0; h < p.hkv; ++h) {
      const float x = s.at(page, h);
      s.write[static_cast<std::size_t>(page * p.hkv + h)] = std::isfinite(x) && x != 0.0f ? std::abs(x) : natural;
    }
}

void build_options(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  PagedOptions& o = p.opts;
  o.causal = in.ConsumeBool();
  o.alignment = in.ConsumeBool() ? MaskAlignment::bottom_right : MaskAlignment::top_left;
  o.window_left = window_side(in);
  o.window_right = window_side(in);
  o.attention_chunk = attention_chunk(in);
  const float caps[] = {0.0f, 0.0f, 5.0f, 30.0f, 1e30f, 1e-40f};
  o.softcap = caps[in.ConsumeIntegralInRange(0, 5)];
  if (in.ConsumeBool()) o.softmax_scale = in.ConsumeFloatingPointInRange(0.01f, 1.0f);
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.slopes.resize(static_cast<std::size_t>(in.ConsumeBool() ? p.hq : p.batch * p.hq));
    for (float& s : p.slopes) s = in.ConsumeFloatingPointInRange(0.0f, 2.0f);
    o.alibi_slopes = p.slopes;
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.sinks.resize(static_cast<std::size_t>(p.hq));
    for (float& s : p.sinks) s = in.ConsumeBool() ? -inf : in.ConsumeFloatingPointInRange(-5.0f, 5.0f);
    o.sinks = p.sinks;
  }
  // Bias and mask: [B or 1, H or 1, longest query count, longest cache_seqlens].
  const index_t sq = p.longest_q, sk = p.longest_k;
  const index_t bb = in.ConsumeBool() ? 1 : p.batch, bh = in.ConsumeBool() ? 1 : p.hq;
  const auto n = static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * sk, 1));
  if (in.ConsumeIntegralInRange(0, 5) == 0) {
    p.bias.resize(n);
    std::normal_distribution<float> normal;
    for (float& x : p.bias) x = in.ConsumeIntegralInRange(0, 50) == 0 ? nan : normal(rng);
    o.bias = {p.bias.data(), {bb, bh, sq, sk}, {bh * sq * sk, sq * sk, sk, 1}};
  }
  if (in.ConsumeIntegralInRange(0, 5) == 0) {
    p.mask.reset(new bool[n]);
    for (std::size_t i = 0; i < n; ++i) p.mask[i] = (rng() % 4) != 0;
    o.mask = {p.mask.get(), {bb, bh, sq, sk}, {bh * sq * sk, sq * sk, sk, 1}};
  }
  o.num_splits = in.ConsumeIntegralInRange(0, 3) == 0 ? 0 : in.ConsumeIntegralInRange(1, 6);
  if (o.num_splits == 6) o.num_splits = std::numeric_limits<index_t>::max();  // as many as there are key tiles (issue 27, N4)
  o.batch_invariant = o.num_splits <= 1 && in.ConsumeIntegralInRange(0, 3) == 0;  // fixed chunks, fixed tiles
  // Small budgets give small key tiles, so that num_splits cuts 60-key sequences.
  p.budget_kind = in.ConsumeIntegralInRange(0, 3);
  switch (p.budget_kind) {
    case 0: o.sram_budget_bytes = 0; break;
    case 1: o.sram_budget_bytes = tileattn::test::rows_budget_any(3, p.d, p.dv); break;
    case 2: o.sram_budget_bytes = tileattn::test::rows_budget_any(16, p.d, p.dv); break;
    default: o.sram_budget_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 1u << 20); break;
  }
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[in.ConsumeIntegralInRange(0, 3)];
  if (!backend_available(backend)) backend = Backend::serial;
  o.execution = {backend, in.ConsumeIntegralInRange(0, 3)};
  // Prefix-once: sequences that share sequence 0's full pages group at small thresholds
  // (60-key sequences never reach the default 256).
  const index_t min_keys[] = {1, 4, 16, 256};
  o.shared_prefix_min_keys = min_keys[in.ConsumeIntegralInRange(0, 3)];
  o.shared_prefix = in.ConsumeIntegralInRange(0, 7) != 0;
}

/// The first and last query position (i + the diagonal's offset) over the sequences with
/// queries; any: some sequence has one.
struct PositionRange {
  bool any = false;
  index_t first = 0, last = 0;
};
PositionRange query_positions(const Problem& p, const ScoreOptions& o) {
  PositionRange r;
  for (index_t b = 0; b < p.batch; ++b) {
    const index_t lq = p.varlen ? p.cu[static_cast<std::size_t>(b) + 1] - p.cu[static_cast<std::size_t>(b)] : p.nq;
    if (lq == 0) continue;
    const index_t off = o.diagonal(lq, p.seqlens[static_cast<std::size_t>(b)]);
    r.first = r.any ? std::min(r.first, off) : off;
    r.last = r.any ? std::max(r.last, off + lq - 1) : off + lq - 1;
    r.any = true;
  }
  return r;
}

/// Rotary embedding of Q (a quarter of the inputs, head_dim >= 2): tables of 1..head_dim / 2
/// columns and enough rows for every query position, and up to 3 more; none when a position
/// is negative (more queries than keys, bottom-right: corrupt() covers that).
void build_rotary(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  if (in.ConsumeIntegralInRange(0, 3) != 0 || p.d < 2) return;
  const index_t half = in.ConsumeIntegralInRange<index_t>(1, p.d / 2);
  const PositionRange range = query_positions(p, p.opts);
  if (range.any && range.first < 0) return;
  const index_t rows = (range.any ? range.last + 1 : 1) + in.ConsumeIntegralInRange(0, 3);
  p.rotary = fuzz::make_rotary_tables(in, rng, rows, half);
  p.opts.rotary = p.rotary.options;
}

/// Sequence b's rows of Q (fixed: b * nq + i; varlen: its packed rows): [first, end).
std::pair<index_t, index_t> rows_of(const Problem& p, index_t b) {
  if (p.varlen) return {p.cu[static_cast<std::size_t>(b)], p.cu[static_cast<std::size_t>(b) + 1]};
  return {b * p.nq, (b + 1) * p.nq};
}

/// A quarter of the inputs: top-k indices for every query row (-1 or a key of its sequence,
/// repeats allowed; varlen's spare rows hold ids never read), and the options top-k takes.
void build_topk(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  if (in.ConsumeIntegralInRange(0, 3) != 0) return;
  p.topk = true;
  p.planned = false;
  p.rerun_toggles_plan = false;
  p.slopes.clear(), p.bias.clear(), p.mask.reset();
  p.opts.alibi_slopes = {}, p.opts.bias = {}, p.opts.mask = {};
  p.rotary = {};
  p.opts.rotary = {};
  p.topk_k = in.ConsumeIntegralInRange(1, 70);
  // (never empty: a view's data must not be null, as for every other view, even with no rows)
  p.topk_idx.assign(static_cast<std::size_t>(std::max<index_t>(view_batch(p) * p.nq * p.topk_k, 1)), INT_MAX);
  const int padding = in.ConsumeIntegralInRange(0, 3);  // in quarters
  for (index_t b = 0; b < p.batch; ++b) {
    const auto [first, end] = rows_of(p, b);
    const std::int32_t len = p.seqlens[static_cast<std::size_t>(b)];
    for (index_t r = first * p.topk_k; r < end * p.topk_k; ++r)
      p.topk_idx[static_cast<std::size_t>(r)] =
          len == 0 || static_cast<int>(rng() % 4) < padding ? -1 : static_cast<std::int32_t>(rng() % static_cast<unsigned>(len));
  }
}

/// Everything but the typed views: shapes, pages, values, options, layouts, the rerun.
/// MLA: every pool row's V is its K row's first dv values, at K's scales.
void make_latent(Problem& p) {
  for (index_t row = 0; row < p.num_pages * p.page * p.hkv; ++row)
    std::copy_n(p.kf.begin() + row * p.d, p.dv, p.vf.begin() + row * p.dv);
  p.vs = p.ks;
}

/// Q: N(0, 1) values for every element of the view, then the input's NaN/Inf poisoning.
void draw_queries(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  p.qf.resize(static_cast<std::size_t>(view_batch(p) * p.nq * p.hq * p.d));
  for (float& x : p.qf) x = normal(rng);
  std::vector<std::size_t> all_q(p.qf.size());
  std::iota(all_q.begin(), all_q.end(), std::size_t{0});
  poison(in, p.qf, all_q);
}

void build(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  p.kv = static_cast<KvType>(in.ConsumeIntegralInRange(0, 7));
  const int q_choice = in.ConsumeIntegralInRange(0, 2);
  p.qt = p.kv <= KvType::fp16 ? static_cast<QType>(p.kv) : static_cast<QType>(q_choice);
  if (p.kv >= KvType::int8 && !(p.qt == QType::fp32 || (p.qt == QType::bf16 && p.kv == KvType::int8)))
    p.qt = QType::fp32;  // the pairs compiled in (execute_q); 4-bit pools: float Q
  p.varlen = in.ConsumeBool();
  p.lse_on = in.ConsumeBool();
  p.planned = in.ConsumeIntegralInRange(0, 2) == 0;
  p.hkv = in.ConsumeIntegralInRange(1, 3);
  p.hq = p.hkv * in.ConsumeIntegralInRange<index_t>(1, 6 / p.hkv);
  p.d = in.ConsumeIntegralInRange(1, 72);
  p.dv = in.ConsumeBool() ? p.d : in.ConsumeIntegralInRange(1, 40);
  if (four_bit(p.kv)) {  // whole blocks of 32 (q4_0) or 16 (nvfp4) values
    const index_t block = p.kv == KvType::q4_0 ? q4_0_block::values : nvfp4_block::values;
    p.d = std::max(block, p.d / block * block);
    p.dv = std::max(block, p.dv / block * block);
  }
  build_sequences(in, p);
  build_pages(in, p, rng);
  if (eight_bit(p.kv)) {
    build_scales(in, p, p.ks, rng);
    build_scales(in, p, p.vs, rng);
    p.opts.k_scale = p.ks.view;
    p.opts.v_scale = p.vs.view;
  }
  draw_queries(in, p, rng);
  build_options(in, p, rng);
  for (Relayout& r : p.layout) r = relayout_of(in.ConsumeIntegral<std::uint8_t>());
  p.lse_layout = in.ConsumeIntegralInRange(0, 1);
  const auto flags = in.ConsumeIntegral<std::uint8_t>();
  p.rerun = flags & 1;
  p.rerun_toggles_plan = (flags >> 5) & 1;
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[(flags >> 1) & 3];
  if (!backend_available(backend)) backend = Backend::serial;
  p.again = {backend, (flags >> 3) & 3};
  build_rotary(in, p, rng);
  if (!four_bit(p.kv)) build_topk(in, p, rng);  // (top-k and MLA take no 4-bit pools yet)
  // A quarter of the other calls where dv <= d and Q is not rotated: MLA (mla.hpp), the K
  // pool a latent pool whose first dv columns are V (V's values and scales become K's).
  p.mla = in.ConsumeIntegralInRange(0, 3) == 0 && !p.topk && !four_bit(p.kv) && p.dv <= p.d &&
          !p.opts.rotary.enabled();
  if (p.mla) make_latent(p);
}

// ---- The typed call ---------------------------------------------------------------------

/// One call's arguments in Q/O type T and K/V type KV (what a corruption changes).
template <class T, class KV>
struct Call {
  Stored<T> q, o;
  Stored<KV> k, v;
  TensorView<const T> qv;
  TensorView<const KV> kv, vv;
  BlockTableView table;
  std::vector<std::int32_t> seqlens, cu;
  TensorView<T> ov;
  std::vector<float> lse;  // the LSE buffer (sentinel)
  LseView lse3{};          // fixed: [B, Hq, nq]
  PackedLseView lse2{};    // varlen: [Hq, total]
  PagedOptions opts;
  std::vector<float> bad_scales;  // a scale buffer for the scale corruptions
  std::vector<float> bad_values;  // ALiBi slopes or sinks for their corruptions
  std::vector<float> bad_table;   // rotary tables for their corruptions
  std::vector<std::int32_t> topk;  // the top-k indices (a corruption may change one)
  index_t topk_rows = 0;           // the indices view's rows (a corruption may add one)
};

template <class T, class KV>
Call<T, KV> make_call(const Problem& p) {
  Call<T, KV> c;
  const index_t vb = view_batch(p);
  c.q = lay_out<T>({vb, p.nq, p.hq, p.d}, p.layout[0], from_float<T>(nan), [&](index_t b, index_t n, index_t h, index_t x) {
    return from_float<T>(p.qf[static_cast<std::size_t>(((b * p.nq + n) * p.hq + h) * p.d + x)]);
  });
  c.o = lay_out<T>({vb, p.nq, p.hq, p.dv}, p.layout[3], from_float<T>(sentinel),
                   [&](index_t, index_t, index_t, index_t) { return from_float<T>(sentinel); });
  const auto pool = [&](const std::vector<float>& f, const Scales& s, index_t dim, const Relayout& r) {
    if constexpr (block_pool_type<KV>) {  // blocks of the rows' values (rotated: turned by H), quantized; gaps a NaN block
      using B = stored_block_t<KV>;
      const std::vector<float> nans(KV::values, nan);
      std::vector<float> row_values(static_cast<std::size_t>(dim));
      return lay_out<KV>({p.num_pages, p.page, p.hkv, dim / KV::values}, r, KV{quantize_block<B>(nans.data())},
                         [&](index_t page, index_t row, index_t h, index_t blk) {
                           const float* x = &f[static_cast<std::size_t>(((page * p.page + row) * p.hkv + h) * dim)];
                           if constexpr (is_hadamard_rotated<KV>) {
                             std::copy_n(x, dim, row_values.begin());
                             ops::hadamard_row(row_values.data(), dim);
                             return KV{quantize_block<B>(&row_values[static_cast<std::size_t>(blk * KV::values)])};
                           } else {
                             return quantize_block<B>(x + blk * KV::values);
                           }
                         });
    } else {
    return lay_out<KV>({p.num_pages, p.page, p.hkv, dim}, r, store_kv<KV>(nan, 1.0f),
                       [&](index_t page, index_t row, index_t h, index_t x) {
                         const float w = quantized_type<KV> ? s.write[static_cast<std::size_t>(page * p.hkv + h)] : 1.0f;
                         return store_kv<KV>(f[static_cast<std::size_t>(((page * p.page + row) * p.hkv + h) * dim + x)], w);
                       });
    }
  };
  c.k = pool(p.kf, p.ks, p.d, p.layout[1]);
  c.v = pool(p.vf, p.vs, p.dv, p.layout[2]);
  c.qv = c.q.view;
  c.kv = c.k.view;
  c.vv = c.v.view;
  c.ov = c.o.view;
  c.table = p.table_view;
  c.seqlens = p.seqlens;
  c.cu = p.cu;
  const index_t step = p.lse_layout + 1;  // 2: every other element, the rest must stay the sentinel
  if (p.mla) {  // the V the call sees: a view of the latent pool (c.v goes unused)
    c.vv = c.kv;
    c.vv.shape[3] = p.dv;
  }
  c.lse.assign(static_cast<std::size_t>(std::max<index_t>(vb * p.hq * p.nq * step, 1)), sentinel);
  if (p.lse_on && !p.varlen) c.lse3 = {c.lse.data(), {p.batch, p.hq, p.nq}, {p.hq * p.nq * step, p.nq * step, step}};
  if (p.lse_on && p.varlen) c.lse2 = {c.lse.data(), {p.hq, p.nq}, {p.nq * step, step}};
  c.opts = p.opts;
  if (p.mla) c.opts.v_scale = {};  // the latent's scales: k_scale alone
  c.topk = p.topk_idx;
  c.topk_rows = view_batch(p) * p.nq;
  return c;
}

template <class T>
PackedView<T> pack(const TensorView<T>& v) {
  return {v.data, {v.shape[1], v.shape[2], v.shape[3]}, {v.stride[1], v.stride[2], v.stride[3]}};
}

/// The entry point the problem names: fixed or varlen, with or without a plan (and the
/// 7-argument forward_paged when there is neither an LSE nor a plan).
template <class T, class KV>
void run_mla(const Problem& p, const Call<T, KV>& c, const PagedOptions& opts, const PagedPlan* plan) {
  if (p.varlen && plan)
    forward_paged_mla_varlen(*plan, pack(c.qv), c.kv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
  else if (p.varlen)
    forward_paged_mla_varlen(pack(c.qv), c.kv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
  else if (plan)
    forward_paged_mla(*plan, c.qv, c.kv, c.table, c.seqlens, c.ov, c.lse3, opts);
  else if (!p.lse_on)
    forward_paged_mla(c.qv, c.kv, c.table, c.seqlens, c.ov, opts);
  else
    forward_paged_mla(c.qv, c.kv, c.table, c.seqlens, c.ov, c.lse3, opts);
}

/// forward_paged_topk(_varlen): the problem's indices, [rows, topk] or [batch, nq, topk].
template <class T, class KV>
void run_topk(const Problem& p, const Call<T, KV>& c, const PagedOptions& opts) {
  if (p.varlen) {
    const PackedTopkIndicesView idx{c.topk.data(), {c.topk_rows, p.topk_k}, {p.topk_k, 1}};
    forward_paged_topk_varlen(pack(c.qv), c.kv, c.vv, c.table, c.seqlens, idx, pack(c.ov), c.lse2, c.cu, opts);
    return;
  }
  const TopkIndicesView idx{c.topk.data(), {c.topk_rows / p.nq, p.nq, p.topk_k}, {p.nq * p.topk_k, p.topk_k, 1}};
  if (p.lse_on) forward_paged_topk(c.qv, c.kv, c.vv, c.table, c.seqlens, idx, c.ov, c.lse3, opts);
  else forward_paged_topk(c.qv, c.kv, c.vv, c.table, c.seqlens, idx, c.ov, opts);
}

template <class T, class KV>
void run(const Problem& p, const Call<T, KV>& c, const PagedOptions& opts, const PagedPlan* plan) {
  if constexpr (!block_pool_type<KV>) {  // (MLA and top-k take no 4-bit pools: never drawn)
    if (p.mla) return run_mla(p, c, opts, plan);
    if (p.topk) return run_topk(p, c, opts);
  }
  if (p.varlen) {
    if (plan)
      forward_paged_varlen(*plan, pack(c.qv), c.kv, c.vv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
    else
      forward_paged_varlen(pack(c.qv), c.kv, c.vv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
  } else if (plan) {
    forward_paged(*plan, c.qv, c.kv, c.vv, c.table, c.seqlens, c.ov, c.lse3, opts);
  } else if (!p.lse_on) {
    forward_paged(c.qv, c.kv, c.vv, c.table, c.seqlens, c.ov, opts);
  } else {
    forward_paged(c.qv, c.kv, c.vv, c.table, c.seqlens, c.ov, c.lse3, opts);
  }
}

template <class T, class KV>
PagedPlan make_plan(const Problem& p, const Call<T, KV>& c, const PagedOptions& opts) {
  if constexpr (!block_pool_type<KV>) {
    if (p.mla && p.varlen)
      return plan_forward_paged_mla_varlen(pack(c.qv), c.kv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
    if (p.mla) return plan_forward_paged_mla(c.qv, c.kv, c.table, c.seqlens, c.ov, c.lse3, opts);
  }
  if (p.varlen) return plan_forward_paged_varlen(pack(c.qv), c.kv, c.vv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu, opts);
  return plan_forward_paged(c.qv, c.kv, c.vv, c.table, c.seqlens, c.ov, c.lse3, opts);
}

// ---- Bad arguments ----------------------------------------------------------------------

constexpr int corruption_count = 32;
constexpr int plan_mismatch = 9;

/// One input byte: a corruption (about half the inputs) or none (-1).
int choose_corruption(FuzzedDataProvider& in) {
  const int x = in.ConsumeIntegralInRange(0, 2 * corruption_count - 1);
  return x < corruption_count ? x : -1;
}

/// Rotary tables the call cannot use: a position short, wider than head_dim, one missing,
/// of two shapes, a negative stride, or on O.
template <class T, class KV>
std::string corrupt_rotary(FuzzedDataProvider& in, const Problem& p, Call<T, KV>& c) {
  const PositionRange range = query_positions(p, c.opts);
  const index_t half = std::max<index_t>(1, p.d / 2), ld = half + 1, rows = range.any ? std::max<index_t>(range.last + 1, 1) : 1;
  c.bad_table.assign(static_cast<std::size_t>(2 * rows * ld), 0.5f);
  RotaryOptions r{{c.bad_table.data(), {rows, half}, {ld, 1}}, {c.bad_table.data() + rows * ld, {rows, half}, {ld, 1}},
                  in.ConsumeBool()};
  std::string what;
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0:  // (a negative position fails with any table)
      if (!range.any) return "none";
      r.cos.shape[0] = r.sin.shape[0] = range.first < 0 ? rows : rows - 1;
      what = "rotary tables a position short";
      break;
    case 1: r.cos.shape[1] = r.sin.shape[1] = p.d / 2 + 1; what = "rotary_dim above head_dim"; break;
    case 2: (in.ConsumeBool() ? r.cos : r.sin) = {}; what = "one rotary table null"; break;
    case 3: (in.ConsumeBool() ? r.sin.shape[0] : r.sin.shape[1]) += 1; what = "rotary tables of two shapes"; break;
    case 4: r.cos.stride[0] = -1; what = "rotary_cos stride negative"; break;
    default:
      if (c.ov.empty()) return "none";
      r.cos.data = reinterpret_cast<const float*>(c.ov.data);  // only compared, never read
      what = "rotary_cos on o";
  }
  c.opts.rotary = r;
  return what;
}

/// Makes the call invalid as `choice` says; returns what it did ("none" where the choice
/// does not apply to this call, e.g. a page id corruption when no sequence has keys).
/// Every change here must be rejected.
/// A top-k call's own corruptions: an index outside [-1, cache_seqlens) in a row some
/// sequence owns, or one row too many in the indices view.
template <class T, class KV>
std::string corrupt_topk(FuzzedDataProvider& in, const Problem& p, Call<T, KV>& c) {
  if (in.ConsumeBool()) {
    c.topk_rows += p.varlen ? 1 : p.nq;
    return "topk_indices shape";
  }
  for (index_t b = 0; b < p.batch; ++b) {
    const auto [first, end] = rows_of(p, b);
    if (first == end) continue;
    const index_t row = in.ConsumeIntegralInRange<index_t>(first, end - 1), j = in.ConsumeIntegralInRange<index_t>(0, p.topk_k - 1);
    const std::int32_t len = p.seqlens[static_cast<std::size_t>(b)];
    const std::int32_t bad[] = {len, INT_MAX, -2, INT_MIN};
    c.topk[static_cast<std::size_t>(row * p.topk_k + j)] = bad[in.ConsumeIntegralInRange(0, 3)];
    return "topk index out of range";
  }
  return "none";
}

template <class T, class KV>
std::string corrupt(int choice, FuzzedDataProvider& in, const Problem& p, Call<T, KV>& c) {
  if (p.topk && (choice == plan_mismatch || in.ConsumeIntegralInRange(0, 3) == 0)) return corrupt_topk(in, p, c);
  constexpr auto past_ptrdiff_max = static_cast<index_t>((std::uint64_t{1} << 63) / sizeof(KV));
  const auto some = [&](index_t n) { return in.ConsumeIntegralInRange<index_t>(0, std::max<index_t>(n - 1, 0)); };
  const index_t b = some(p.batch);
  const bool o_nonempty = !c.ov.empty(), pool_nonempty = p.num_pages > 0;
  switch (choice) {
    case 0: {  // a used table entry outside the pool
      for (index_t i = 0; i < p.batch; ++i) {
        const index_t s = (b + i) % p.batch, len = c.seqlens[static_cast<std::size_t>(s)];
        if (len == 0) continue;
        const index_t j = some((len + p.page - 1) / p.page);
        const std::int32_t bad[] = {-1, INT_MIN, static_cast<std::int32_t>(p.num_pages), INT_MAX};
        const_cast<std::int32_t&>(c.table(s, j)) = bad[in.ConsumeIntegralInRange(0, 3)];
        return "table entry [" + std::to_string(s) + ", " + std::to_string(j) + "] out of the pool";
      }
      return "none";
    }
    case 1:
      c.seqlens[static_cast<std::size_t>(b)] = in.ConsumeBool() ? INT_MAX : static_cast<std::int32_t>(p.max_pages * p.page + 1);
      return "cache_seqlens beyond the table";
    case 2: c.seqlens[static_cast<std::size_t>(b)] = in.ConsumeBool() ? -1 : INT_MIN; return "cache_seqlens negative";
    case 3:
      if (in.ConsumeBool()) c.seqlens.pop_back(); else c.seqlens.push_back(0);
      return "cache_seqlens count";
    case 4:
      if (p.hkv > 1) {
        c.qv.shape[2] = c.ov.shape[2] = p.hq + 1;
        c.lse3.shape[1] = c.lse2.shape[0] = p.hq + 1;
        return "heads_q not a multiple of heads_kv";
      }
      if (p.mla) return "none";  // MLA has one pool
      c.vv.shape[2] += 1;
      return "pools' heads_kv differ";
    case 5: c.kv.shape[3] += 1; c.vv.shape[3] += in.ConsumeBool(); return "head_dim of k_cache";
    case 6: c.ov.shape[3] += 1; return "head_dim_v of o";
    case 7: {  // a scale view of the wrong extent (8-bit), or any scale on 16/32-bit pools
      c.bad_scales.assign(static_cast<std::size_t>((p.num_pages + 2) * (p.hkv + 1)), 1.0f);
      if (!quantized_type<KV>) {
        (in.ConsumeBool() ? c.opts.k_scale : c.opts.v_scale) = per_tensor_scale(c.bad_scales.data());
        return "scales on a " + std::string(kv_type_name<KV>()) + " pool";
      }
      if (in.ConsumeBool()) c.opts.k_scale = {c.bad_scales.data(), {p.num_pages + 2, p.hkv}, {p.hkv, 1}};
      else c.opts.v_scale = {c.bad_scales.data(), {1, p.hkv + 1}, {0, 1}};
      return "scale extent";
    }
    case 8: {  // a scale view that is itself bad: negative stride, overflowing
      if (!quantized_type<KV> || p.num_pages < 2) return "none";
      c.bad_scales.assign(static_cast<std::size_t>(p.num_pages * p.hkv), 1.0f);
      KvScaleView s{c.bad_scales.data(), {p.num_pages, p.hkv}, {p.hkv, 1}};
      if (in.ConsumeBool()) s.stride[0] = -p.hkv; else s.stride[0] = std::numeric_limits<index_t>::max() / 2;
      (in.ConsumeBool() ? c.opts.k_scale : c.opts.v_scale) = s;
      return "scale view strides";
    }
    case plan_mismatch: return "plan mismatch";  // execute() makes the plan from another call
    case 10:
      switch (in.ConsumeIntegralInRange(0, 4)) {
        case 0: if (c.qv.empty()) return "none"; c.qv.data = nullptr; return "null q";
        case 1: if (!pool_nonempty) return "none"; c.kv.data = nullptr; return "null k_cache";
        case 2: if (!pool_nonempty || p.mla) return "none"; c.vv.data = nullptr; return "null v_cache";
        case 3: if (!o_nonempty) return "none"; c.ov.data = nullptr; return "null o";
        default: c.table.data = nullptr; return "null block_table";
      }
    case 11:
      if (in.ConsumeBool()) {
        c.opts.shared_prefix_min_keys = -in.ConsumeIntegralInRange(0, 3);
        return "shared_prefix_min_keys < 1";
      }
      c.opts.num_splits = -in.ConsumeIntegralInRange(1, 3);
      return "num_splits negative";
    case 12: (in.ConsumeBool() ? c.opts.window_left : c.opts.window_right) = -2 - in.ConsumeIntegralInRange(0, 5); return "window < -1";
    case 13: { const float bad[] = {-1.0f, nan, inf, std::numeric_limits<float>::max()}; c.opts.softcap = bad[in.ConsumeIntegralInRange(0, 3)]; return "softcap"; }
    case 14: { const float bad[] = {0.0f, nan, -1.0f, inf}; c.opts.softmax_scale = bad[in.ConsumeIntegralInRange(0, 3)]; return "softmax_scale"; }
    case 15: c.opts.execution.num_threads = in.ConsumeBool() ? -1 : max_threads + 1; return "num_threads";
    case 16: c.opts.sram_budget_bytes = in.ConsumeBool() ? max_sram_budget_bytes + 1 : 16; return "sram_budget_bytes";
    case 17:  // a wrong count, or a NaN slope
      if (in.ConsumeBool()) c.bad_values.assign(static_cast<std::size_t>(p.batch * p.hq + 1), 0.1f);
      else c.bad_values.assign(static_cast<std::size_t>(p.hq), nan);
      c.opts.alibi_slopes = c.bad_values;
      return "alibi_slopes";
    case 18:
      if (in.ConsumeBool()) c.bad_values.assign(static_cast<std::size_t>(p.hq + 1), 0.5f);
      else c.bad_values.assign(static_cast<std::size_t>(p.hq), nan);
      c.opts.sinks = c.bad_values;
      return "sinks";
    case 19:
      if (!p.varlen) {  // fixed: no queries
        c.qv.shape[1] = c.ov.shape[1] = c.lse3.shape[2] = 0;
        return "seqlen_q 0";
      }
      switch (in.ConsumeIntegralInRange(0, 4)) {
        case 0: c.cu[0] = 1; return "cu_seqlens_q not from 0";
        case 1: c.cu.back() = static_cast<std::int32_t>(p.nq + 1); return "cu_seqlens_q past the rows";
        case 2: c.cu.back() = c.cu[c.cu.size() - 2] - 1; return "cu_seqlens_q decreasing";
        case 3: c.cu.pop_back(); return "cu_seqlens_q one short";
        default:
          if (in.ConsumeBool() && c.cu.size() > 2) {  // INT32_MAX - -2 overflowed int (issue 27, N4)
            c.cu[1] = -2;
            c.cu[2] = INT_MAX;
            return "cu_seqlens_q negative, then INT32_MAX";
          }
          c.cu.clear();
          return "cu_seqlens_q empty";
      }
    case 20:  // aliasing
      switch (in.ConsumeIntegralInRange(0, 2)) {
        case 0:
          if (!o_nonempty || c.qv.empty()) return "none";
          c.ov.data = const_cast<T*>(c.qv.data);
          return "o is q";
        case 1:
          if (!o_nonempty || !pool_nonempty) return "none";
          c.ov.data = reinterpret_cast<T*>(const_cast<KV*>(c.vv.data));  // only compared, never written
          return "o on v_cache";
        default:
          if (!o_nonempty || !p.lse_on || c.lse.empty() || p.hq * p.nq == 0 || !std::is_same_v<T, float>) return "none";
          c.lse3.data = c.lse2.data = reinterpret_cast<float*>(c.ov.data);
          return "lse on o";
      }
    case 21:  // a negative stride
      switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0: c.kv.stride[1] = -1; return "k_cache stride";
        case 1: c.table.stride[1] = -1; return "block_table stride";
        case 2: c.ov.stride[3] = -1; return "o stride";
        default:
          if (!p.lse_on) return "none";
          c.lse3.stride[2] = c.lse2.stride[1] = -1;
          return "lse stride";
      }
    case 22:
      if (in.ConsumeBool() && std::any_of(c.seqlens.begin(), c.seqlens.end(), [](std::int32_t n) { return n > 0; })) {
        // A pool of no pages may have any page size, but a sequence with keys needs a page
        // (len + page_size - 1 overflowed at INT64_MAX: issue 27, N4).
        c.kv.shape[0] = c.vv.shape[0] = 0;
        c.kv.shape[1] = c.vv.shape[1] = std::numeric_limits<index_t>::max();
        c.kv.stride[0] = c.kv.stride[1] = c.vv.stride[0] = c.vv.stride[1] = 0;
        return "no pages of INT64_MAX keys";
      }
      c.kv.shape[1] = c.vv.shape[1] = 0;
      return "page_size 0";
    case 23: if (p.mla) return "none"; c.vv.shape[0] += 1; return "pools' num_pages differ";
    case 24: c.table.shape[0] += 1; return "block_table batch";
    case 25:
      if (!p.lse_on) return "none";
      c.lse3.shape[2] += 1;
      c.lse2.shape[1] += 1;
      return "lse shape";
    case 26: c.kv.shape[3] = max_head_dim + 1; return "head_dim above the maximum";
    case 27:
      if (in.ConsumeBool() && !p.varlen) {
        c.qv.shape[1] = c.ov.shape[1] = index_t{1} << 62;
        return "q element count overflow";
      }
      c.kv.shape[0] = std::max<index_t>(c.kv.shape[0], 2);  // reaches past 2^63 bytes either way
      c.vv.shape[0] = c.kv.shape[0];
      c.kv.stride[0] = past_ptrdiff_max;
      return "k_cache address range";
    case 29: c.opts.attention_chunk = -1 - in.ConsumeIntegralInRange(0, 5); return "attention_chunk < 0";
    case 30:
      c.opts.batch_invariant = true;
      c.opts.num_splits = 2 + in.ConsumeIntegralInRange(0, 3);
      return "num_splits > 1 with batch_invariant";
    case 31: return corrupt_rotary(in, p, c);
    default:
      c.ov.shape[1] += 1;
      return "o seqlen or total";
  }
}

/// The plan of a call that differs from `c` in one thing the plan depends on.
template <class T, class KV>
PagedPlan mismatched_plan(FuzzedDataProvider& in, const Problem& p, Call<T, KV> other, std::string& what) {
  PagedOptions& o = other.opts;
  o.rotary = {};  // the plan does not depend on it, and a shorter sequence may move a query before position 0
  switch (in.ConsumeIntegralInRange(0, 5)) {
    case 0: o.causal = !o.causal; what = "plan for causal flipped"; break;
    case 1:
      if (o.batch_invariant) o.batch_invariant = false, what = "plan for batch_invariant on";
      else o.num_splits = o.num_splits == 2 ? 3 : 2, what = "plan for another num_splits";
      break;
    case 2: o.window_left = o.window_left == 3 ? -1 : 3; what = "plan for another window"; break;
    case 3: o.alignment = o.alignment == MaskAlignment::top_left ? MaskAlignment::bottom_right : MaskAlignment::top_left;
            what = "plan for another alignment"; break;
    case 4: o.sram_budget_bytes = o.sram_budget_bytes == 0 ? tileattn::test::rows_budget_any(16, p.d, p.dv) : 0;
            what = "plan for another budget"; break;
    default: {
      // One sequence a key shorter (still within its pages); with a bias or mask, whose
      // extent is the longest sequence, one that leaves the longest as it is.
      auto& lens = other.seqlens;
      const auto longest = std::max_element(lens.begin(), lens.end());
      auto shorter = longest;
      if (o.bias.data || o.mask.data) {
        shorter = lens.end();
        for (auto it = lens.begin(); it != lens.end(); ++it)
          if (*it > 0 && (*it < *longest || std::count(lens.begin(), lens.end(), *longest) > 1)) shorter = it;
      }
      if (shorter != lens.end() && *shorter > 0) {
        *shorter -= 1;
        what = "plan for other cache_seqlens";
      } else {
        o.causal = !o.causal;
        what = "plan for causal flipped";
      }
    }
  }
  return make_plan(p, other, o);
}

// ---- The reference and the checks -------------------------------------------------------

/// Sequence b's K or V gathered from the pool through the block table, dequantized:
/// [1, len, hkv, dim], contiguous. Rotated pools' rows stay as stored (turned by H):
/// check_against_reference works in the rotated basis.
template <class KV>
std::vector<float> gather(const Problem& p, const TensorView<const KV>& pool, const Scales& s, index_t b) {
  const index_t len = p.seqlens[static_cast<std::size_t>(b)], dim = pool.shape[3] * values_per_element<KV>;
  std::vector<float> out(static_cast<std::size_t>(len * p.hkv * dim));
  for (index_t r = 0; r < len; ++r) {
    const index_t page = p.table_view(b, r / p.page);
    for (index_t h = 0; h < p.hkv; ++h) {
      if constexpr (block_pool_type<KV>) {  // 4-bit: each block's values
        float* row = &out[static_cast<std::size_t>((r * p.hkv + h) * dim)];
        for (index_t blk = 0; blk < pool.shape[3]; ++blk)
          if constexpr (is_hadamard_rotated<KV>) dequantize_block(pool(page, r % p.page, h, blk).block, row + blk * KV::values);
          else dequantize_block(pool(page, r % p.page, h, blk), row + blk * KV::values);
      } else {
        const float scale = s.at(page, h);
        for (index_t x = 0; x < dim; ++x)
          out[static_cast<std::size_t>((r * p.hkv + h) * dim + x)] = load_kv(pool(page, r % p.page, h, x), scale);
      }
    }
  }
  return out;
}

/// A float copy of a T tensor's buffer with the same view over it (exact).
template <class T>
std::pair<std::vector<float>, TensorView<const float>> mirror(const Stored<T>& s, const TensorView<T>& view) {
  std::vector<float> m(s.data.size());
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = to_float(s.data[i]);
  const TensorView<const float> v{m.data() + (view.data - s.data.data()), view.shape, view.stride};
  return {std::move(m), v};
}

/// Q's float mirror rotated as the kernel rotates it (options.rotary): query i of sequence b
/// at i + the diagonal's offset, rounded to T. Rows past cu_seqlens_q's end stay.
template <class T>
void rotate_queries(const Problem& p, const RotaryOptions& r, const TensorView<const float>& q) {
  if (!r.enabled()) return;
  std::vector<float> row(static_cast<std::size_t>(p.d));
  for (index_t b = 0; b < p.batch; ++b) {
    const index_t start = p.varlen ? p.cu[static_cast<std::size_t>(b)] : 0;
    const index_t lq = p.varlen ? p.cu[static_cast<std::size_t>(b) + 1] - start : p.nq;
    const index_t vb = p.varlen ? 0 : b, off = p.opts.diagonal(lq, p.seqlens[static_cast<std::size_t>(b)]);
    for (index_t i = 0; i < lq; ++i)
      for (index_t h = 0; h < p.hq; ++h) {
        for (index_t x = 0; x < p.d; ++x) row[static_cast<std::size_t>(x)] = q(vb, start + i, h, x);
        fuzz::rotate_reference<T>(r, row.data(), i + off);
        for (index_t x = 0; x < p.d; ++x) const_cast<float&>(q(vb, start + i, h, x)) = row[static_cast<std::size_t>(x)];
      }
  }
}

/// Top-k: query row i of sequence b (rows [start, start + lq) of the views) against the
/// double reference over its list itself: K/V [1, topk, hkv, dim] the listed keys' rows in
/// list order (a duplicate twice, padding as a row the mask hides), with a mask [1, 1, 1,
/// topk] that keeps an entry when it is a key the row sees densely (reference::outside_window
/// at the key's own position), and no causal, window or chunk left. (A mask over the whole
/// sequence with a bias of log(times listed) is the same in exact arithmetic, but at scores
/// near 1e30 the bias rounds away.)
Deviation check_topk_row(const Problem& p, const std::vector<std::int32_t>& idx, const reference::Options& ro, index_t b,
                         index_t i, index_t lq, const std::vector<float>& kb, const std::vector<float>& vb,
                         const TensorView<const float>& q_row, const TensorView<const float>& o_row, const LseView& lse_row) {
  const index_t len = p.seqlens[static_cast<std::size_t>(b)], k = p.topk_k;
  const index_t offset = ro.diagonal(lq, len), right = ro.causal ? 0 : ro.window_right;
  std::vector<float> kl(static_cast<std::size_t>(k * p.hkv * p.d), 0.0f), vl(static_cast<std::size_t>(k * p.hkv * p.dv), 0.0f);
  std::unique_ptr<bool[]> keep(new bool[static_cast<std::size_t>(k)]());
  for (index_t j = 0; j < k; ++j) {
    const std::int32_t key = idx[static_cast<std::size_t>((rows_of(p, b).first + i) * k + j)];
    if (key < 0) continue;
    keep[static_cast<std::size_t>(j)] = !reference::outside_window(ro, i, offset, key, ro.window_left, right);
    std::copy_n(kb.begin() + key * p.hkv * p.d, p.hkv * p.d, kl.begin() + j * p.hkv * p.d);
    std::copy_n(vb.begin() + key * p.hkv * p.dv, p.hkv * p.dv, vl.begin() + j * p.hkv * p.dv);
  }
  reference::Options rr = ro;
  rr.causal = false;
  rr.window_left = rr.window_right = -1;
  rr.attention_chunk = 0;
  rr.mask = {keep.get(), {1, 1, 1, k}, {0, 0, k, 1}};
  const auto ref = reference::attention<float>(q_row, make_bshd<const float>(kl.data(), 1, k, p.hkv, p.d),
                                               make_bshd<const float>(vl.data(), 1, k, p.hkv, p.dv), rr);
  return test::compare_to_reference(ref, o_row, lse_row);
}

/// x[0, n) = H_n x in double (n a power of two): the Sylvester butterflies, then 1 / sqrt(n),
/// written apart from ops::hadamard_row so that the reference does not lean on it.
void hadamard_double(double* x, index_t n) {
  for (index_t span = 1; span < n; span *= 2)
    for (index_t i = 0; i < n; i += 2 * span)
      for (index_t j = i; j < i + span; ++j) {
        const double a = x[j], b = x[j + span];
        x[j] = a + b;
        x[j + span] = a - b;
      }
  for (index_t j = 0; j < n; ++j) x[j] /= std::sqrt(static_cast<double>(n));
}

/// Rotated pools: the reference in the kernel's basis. The pools hold H K and H V, so
/// attention over them with H q and H applied to its O is attention over K and V (H H = I,
/// ops/hadamard.hpp); Q's rows (after rotary) are turned by H in float as the kernel turns
/// them. Not the pools' rows turned back instead: a non-finite Q element reaches every
/// element of H q (IEEE: an Inf in Q makes its row's scores NaN over rotated pools, where
/// over plain ones they are +-Inf), and that is what the kernel computes.
template <class T>
void hadamard_queries(const Problem& p, const TensorView<const float>& q) {
  std::vector<float> row(static_cast<std::size_t>(p.d));
  test::for_each_index({q.shape[0], q.shape[1], q.shape[2], 1}, [&](index_t b, index_t n, index_t h, index_t) {
    for (index_t x = 0; x < p.d; ++x) row[static_cast<std::size_t>(x)] = q(b, n, h, x);
    ops::hadamard_row(row.data(), p.d);
    for (index_t x = 0; x < p.d; ++x) const_cast<float&>(q(b, n, h, x)) = row[static_cast<std::size_t>(x)];
  });
}

/// Each sequence against the double reference; max_v receives max |V| (finite, used).
template <class T, class KV>
Deviation check_against_reference(const Problem& p, const Call<T, KV>& c, double& max_v) {
  auto [qm, q] = mirror(c.q, c.q.view);
  rotate_queries<T>(p, c.opts.rotary, q);
  if constexpr (is_hadamard_rotated<KV>) hadamard_queries<T>(p, q);
  auto [om, o] = mirror(c.o, c.ov);
  const reference::Options ro = reference::Options::from(c.opts);
  Deviation all;
  const auto first_row = [](const TensorView<const float>& t, index_t b, index_t start, index_t len) {
    return TensorView<const float>{t.data + b * t.stride[0] + start * t.stride[1], {1, len, t.shape[2], t.shape[3]}, t.stride};
  };
  for (index_t b = 0; b < p.batch; ++b) {
    const index_t len = p.seqlens[static_cast<std::size_t>(b)];
    const std::vector<float> kb = gather(p, c.kv, p.ks, b), vb = gather(p, c.vv, p.vs, b);
    for (float x : vb)
      if (std::isfinite(x)) max_v = std::max(max_v, std::abs(static_cast<double>(x)));
    const index_t start = p.varlen ? p.cu[static_cast<std::size_t>(b)] : 0;
    const index_t lq = p.varlen ? p.cu[static_cast<std::size_t>(b) + 1] - start : p.nq;
    const index_t vbatch = p.varlen ? 0 : b;
    reference::Options rb = ro;
    rb.batch_index = b;
    LseView lse{};
    if (p.lse_on && p.varlen) lse = {const_cast<float*>(c.lse2.data) + start * c.lse2.stride[1], {1, p.hq, lq}, {0, c.lse2.stride[0], c.lse2.stride[1]}};
    if (p.lse_on && !p.varlen) lse = {c.lse3.data + b * c.lse3.stride[0], {1, p.hq, lq}, c.lse3.stride};
    for (index_t i = 0; p.topk && i < lq; ++i) {
      const Deviation d = check_topk_row(p, c.topk, rb, b, i, lq, kb, vb, first_row(q, vbatch, start + i, 1),
                                         first_row(o, vbatch, start + i, 1), lse.data ? lse.slice(2, i, 1) : LseView{});
      all.o = std::max(all.o, d.o);
      all.lse = std::max(all.lse, d.lse);
      if (all.problem.empty() && !d.problem.empty()) all.problem = "sequence " + std::to_string(b) + " row " + std::to_string(i) + ": " + d.problem;
    }
    if (p.topk) continue;
    auto ref = reference::attention<float>(first_row(q, vbatch, start, lq),
                                           make_bshd<const float>(kb.data(), 1, len, p.hkv, p.d),
                                           make_bshd<const float>(vb.data(), 1, len, p.hkv, p.dv), rb);
    if constexpr (is_hadamard_rotated<KV>)  // O back from the rotated basis
      for (std::size_t row = 0; row < ref.o.size(); row += static_cast<std::size_t>(p.dv)) hadamard_double(&ref.o[row], p.dv);
    const Deviation d = test::compare_to_reference(ref, first_row(o, vbatch, start, lq), lse);
    all.o = std::max(all.o, d.o);
    all.lse = std::max(all.lse, d.lse);
    if (all.problem.empty() && !d.problem.empty()) all.problem = "sequence " + std::to_string(b) + ": " + d.problem;
  }
  return all;
}

/// Buffer elements outside a view (nothing covered when the view is empty) that changed.
template <class T, int R>
std::size_t written_outside(const StridedView<T, R>& view, const std::vector<T>& buffer, T value) {
  if (view.empty()) return buffer.size() - static_cast<std::size_t>(std::count_if(buffer.begin(), buffer.end(), [&](const T& x) {
                                  return std::memcmp(&x, &value, sizeof(T)) == 0;
                                }));
  return fuzz::changed_outside(view, buffer, value);
}

/// The O error bound for Q/O type T (file comment).
template <class T>
double o_bound(double max_v) {
  if constexpr (std::is_same_v<T, bf16>) return 1e-4 + 0x1p-7 * max_v;
  else if constexpr (std::is_same_v<T, fp16>) return 1e-4 + 0x1p-10 * max_v;
  else return 1e-4;
}
constexpr double lse_bound = 1e-4;

std::string describe(const Problem& p, const std::string& corruption, const std::array<const index_t*, 4>& strides) {
  const PagedOptions& o = p.opts;
  std::string s = std::string("Q ") + q_names[static_cast<int>(p.qt)] + " KV " + kv_names[static_cast<int>(p.kv)] +
                  four_bit_names[static_cast<int>(p.four_bit)] +
                  (p.mla ? " mla" : "") + (p.varlen ? " varlen" : " fixed") + (p.planned ? " planned" : "") +
                  (p.topk ? " topk " + std::to_string(p.topk_k) : "") + (p.lse_on ? " lse" : "") +
                  (p.lse_layout ? " (strided)" : "") + " B " + std::to_string(p.batch) + " Nq " + std::to_string(p.nq) +
                  " H " + std::to_string(p.hq) + "/" + std::to_string(p.hkv) + " d " + std::to_string(p.d) + " dv " +
                  std::to_string(p.dv) + " page " + std::to_string(p.page) + " pages " + std::to_string(p.num_pages) +
                  " table " + std::to_string(p.max_pages) + " cols layout " + std::to_string(p.table_layout) +
                  " poison " + std::to_string(p.table_poison) + (p.share ? " shared prefix" : "") + "\n  cache_seqlens";
  for (auto x : p.seqlens) s += " " + std::to_string(x);
  if (p.varlen) {
    s += " cu_q";
    for (auto x : p.cu) s += " " + std::to_string(x);
  }
  s += "\n  causal " + std::to_string(o.causal) + " top_left " + std::to_string(o.alignment == MaskAlignment::top_left) +
       " window " + std::to_string(o.window_left) + "," + std::to_string(o.window_right) + " chunk " +
       std::to_string(o.attention_chunk) + " softcap " +
       std::to_string(o.softcap) + " scale " + (o.softmax_scale ? std::to_string(*o.softmax_scale) : "default") +
       " alibi " + std::to_string(p.slopes.size()) + " sinks " + std::to_string(p.sinks.size()) + " bias " +
       std::to_string(p.bias.size()) + " mask " + std::to_string(p.mask != nullptr) + " splits " +
       std::to_string(o.num_splits) + (o.batch_invariant ? " batch_invariant" : "") + " budget " +
       std::to_string(o.sram_budget_bytes) + " backend " +
       to_string(o.execution.backend) + " x " + std::to_string(o.execution.num_threads) + " rotary " +
       p.rotary.describe();
  if (eight_bit(p.kv))
    s += std::string("\n  k_scale ") + granularity_names[static_cast<int>(p.ks.kind)] + " v_scale " +
         granularity_names[static_cast<int>(p.vs.kind)];
  s += "\n  layouts:" + describe_layout("q", p.layout[0], strides[0]) + ";" + describe_layout("k", p.layout[1], strides[1]) +
       ";" + describe_layout("v", p.layout[2], strides[2]) + ";" + describe_layout("o", p.layout[3], strides[3]);
  if (p.rerun)
    s += "\n  rerun on " + std::string(to_string(p.again.backend)) + " x " + std::to_string(p.again.num_threads) +
         (p.rerun_toggles_plan ? (p.planned ? " without a plan" : " with a plan") : "");
  return s + "\n  corruption: " + corruption;
}

/// Whether the thrown error is one a call without corruption may raise: a random budget
/// that fits no tile.
bool allowed_for_valid_call(const Problem& p, const tileattn::invalid_argument& err) {
  return p.budget_kind == 3 && dynamic_cast<const budget_error*>(&err) != nullptr;
}

/// Runs `call` (a call of the problem's entry point on c); on invalid_argument checks the
/// rule for rejected calls and returns false.
template <class T, class KV, class F>
bool attempt_call(const Problem& p, Call<T, KV>& c, bool corrupted, const std::string& info, F&& call) {
  const std::vector<KV> k_before = c.k.data, v_before = c.v.data;
  const T o_sentinel = from_float<T>(sentinel);
  try {
    call();
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("paged_fuzz", err);
    if (!all_bits_equal(c.o.data, o_sentinel) || !test::all_equal(c.lse, sentinel))
      fail(std::string("wrote outputs before throwing: ") + err.what() + "\n  " + info);
    if (!same_bits(k_before, c.k.data) || !same_bits(v_before, c.v.data))
      fail(std::string("changed a pool before throwing: ") + err.what() + "\n  " + info);
    if (!corrupted && !allowed_for_valid_call(p, err)) fail(std::string("rejected a valid call: ") + err.what() + "\n  " + info);
    return false;
  }
  if (corrupted) fail("accepted a corrupted call\n  " + info);
  return true;
}

/// The call, with its plan when planned; on invalid_argument checks the rule for rejected
/// calls and returns false.
template <class T, class KV>
bool attempt(const Problem& p, Call<T, KV>& c, const std::optional<PagedPlan>& plan, bool corrupted,
             const std::string& info) {
  return attempt_call(p, c, corrupted, info, [&] {
    if (plan) {
      try {  // the planner on the same (maybe corrupted) arguments; the corruption is not the plan's
        (void)make_plan(p, c, c.opts);
        if (corrupted && p.corruption != plan_mismatch) fail("the planner accepted a corrupted call\n  " + info);
      } catch (const tileattn::invalid_argument& err) {
        fuzz::require_named("paged_fuzz", err);
        if (!corrupted && !allowed_for_valid_call(p, err)) fail(std::string("the planner rejected a valid call: ") + err.what() + "\n  " + info);
      }
    }
    run(p, c, c.opts, plan ? &*plan : nullptr);
  });
}

template <class T, class KV>
void check_success(const Problem& p, Call<T, KV>& c, const std::string& info, bool verbose) {
  const T o_sentinel = from_float<T>(sentinel);
  double max_v = 0.0;
  const Deviation dev = check_against_reference(p, c, max_v);
  if (!dev.problem.empty()) fail("differs from the reference: " + dev.problem + "\n  " + info);
  if (verbose) std::fprintf(stderr, "paged_fuzz: error %.3g on O (bound %.3g), %.3g on LSE\n", dev.o, o_bound<T>(max_v), dev.lse);
  if (dev.o > o_bound<T>(max_v) || dev.lse > lse_bound)
    fail("error " + std::to_string(dev.o) + " on O (bound " + std::to_string(o_bound<T>(max_v)) + "), " +
         std::to_string(dev.lse) + " on LSE\n  " + info);
  // Nothing outside the views, nor past cu_seqlens_q's end.
  if (const std::size_t n = written_outside(c.ov, c.o.data, o_sentinel))
    fail(std::to_string(n) + " elements of O's buffer outside its view were written\n  " + info);
  const std::size_t lse_out = !p.lse_on ? written_outside(LseView{}, c.lse, sentinel)
                              : p.varlen ? written_outside(c.lse2, c.lse, sentinel)
                                         : written_outside(c.lse3, c.lse, sentinel);
  if (lse_out) fail(std::to_string(lse_out) + " LSE elements outside its view (or not asked for) were written\n  " + info);
  if (p.varlen && p.cu.back() < p.nq) {
    bool written = false;
    const index_t end = p.cu.back();
    test::for_each_index({1, p.nq - end, p.hq, p.dv}, [&](index_t, index_t n, index_t h, index_t x) {
      written |= std::memcmp(&c.ov(0, end + n, h, x), &o_sentinel, sizeof(T)) != 0;
    });
    if (p.lse_on)
      for (index_t h = 0; h < p.hq; ++h)
        for (index_t i = end; i < p.nq; ++i) written |= std::memcmp(&c.lse2(h, i), &sentinel, sizeof(float)) != 0;
    if (written) fail("wrote O or LSE rows past cu_seqlens_q's end\n  " + info);
  }
}

/// Runs the call again on another execution (and with the plan made separately, or not)
/// and requires the same bits.
template <class T, class KV>
void check_rerun(const Problem& p, Call<T, KV>& c, const std::string& info) {
  const std::vector<T> first_o = c.o.data;
  const std::vector<float> first_lse = c.lse;
  std::fill(c.o.data.begin(), c.o.data.end(), from_float<T>(sentinel));
  std::fill(c.lse.begin(), c.lse.end(), sentinel);
  PagedOptions again = c.opts;
  again.execution = p.again;
  const bool with_plan = p.rerun_toggles_plan ? !p.planned : p.planned;
  if (with_plan) {
    const PagedPlan plan = make_plan(p, c, again);
    run(p, c, again, &plan);
  } else {
    run(p, c, again, nullptr);
  }
  if (!same_bits(first_o, c.o.data) || !same_bits(first_lse, c.lse)) fail("results differ between executions\n  " + info);
}

template <class T, class KV>
void execute(FuzzedDataProvider& in, Problem& p, bool verbose) {
  Call<T, KV> c = make_call<T, KV>(p);
  std::optional<PagedPlan> plan;
  std::string what = "none";
  const bool want_plan = p.planned || (p.corruption == plan_mismatch && !p.topk);  // top-k: no plan
  // The plan of the valid call (the budget may fit no tile: then the call has no plan).
  if (want_plan && p.corruption != plan_mismatch) {
    try {
      plan = make_plan(p, c, c.opts);
    } catch (const tileattn::invalid_argument& err) {
      fuzz::require_named("paged_fuzz", err);
      if (!allowed_for_valid_call(p, err)) fail(std::string("the planner rejected a valid call: ") + err.what());
    }
  }
  if (p.corruption == plan_mismatch && !p.topk) {
    try {
      plan = mismatched_plan(in, p, c, what);
      p.planned = true;
    } catch (const tileattn::invalid_argument& err) {  // the other call's budget fits no tile
      fuzz::require_named("paged_fuzz", err);
      if (!allowed_for_valid_call(p, err)) fail(std::string("the planner rejected a valid call: ") + err.what());
      what = "none";
    }
  } else if (p.corruption >= 0) {
    what = corrupt(p.corruption, in, p, c);
  }
  p.applied = what;
  const bool corrupted = what != "none";
  const std::string info = describe(p, what, {c.q.view.stride.data(), c.k.view.stride.data(), c.v.view.stride.data(), c.o.view.stride.data()});
  if (verbose) std::fprintf(stderr, "paged_fuzz: %s\n", info.c_str());
  if (want_plan && !plan && !corrupted) {  // the budget fits no tile: the unplanned call must say so too
    if (attempt(p, c, plan, false, info)) fail("the planner rejected a call that ran\n  " + info);
    if (verbose) std::fprintf(stderr, "paged_fuzz: rejected (budget)\n");
    return;
  }
  if (!attempt(p, c, plan, corrupted, info)) {
    if (verbose) std::fprintf(stderr, "paged_fuzz: rejected\n");
    return;
  }
  check_success(p, c, info, verbose);
  if (p.rerun) check_rerun(p, c, info);
  if (verbose) std::fprintf(stderr, "paged_fuzz: ok\n");
}

/// 8-bit pools take float Q, and int8 ones bf16 Q too (the bf16 pair path). Every (Q, 8-bit
/// K/V) pair is valid, but each costs about half a minute of compile time under the
/// sanitizers (twelve pairs took 6.5 minutes): these are the ones whose paths differ
/// (fp16 Q reads 8-bit K/V into float tiles as float Q does).
template <class KV>
void execute_q(FuzzedDataProvider& in, Problem& p, bool verbose) {
  if constexpr (std::is_same_v<KV, std::int8_t>)
    if (p.qt == QType::bf16) return execute<bf16, KV>(in, p, verbose);
  execute<float, KV>(in, p, verbose);
}

// ---- Draft-tree masks (the tree tag, file comment) ----------------------------------------

/// A verify step's draft trees and what the mask given to forward_paged_flex was made from
/// (a corruption makes it for another call, or makes draft_tree_mask itself fail).
struct TreeDraw {
  index_t tokens = 1;
  std::vector<std::int32_t> parents;  // one tree (tokens entries) or one per sequence
  BlockSize block{};
  // What draft_tree_mask is called with (the call's own unless corrupted).
  std::vector<std::int32_t> mask_parents, mask_seqlens;
  index_t mask_tokens = 1;
  std::string corruption = "none";
  bool mask_rejected = false;  // the corruption is draft_tree_mask's: it must throw
};

/// Whether draft u is t or an ancestor of t in `tree` (parents[t] < t), walking the array.
bool is_ancestor(const std::int32_t* tree, index_t u, index_t t) {
  for (index_t x = t; x >= 0; x = tree[x])
    if (x == u) return true;
  return false;
}

/// The problem of a verify step: 1 to 3 sequences of 0 to 60 accepted positions and the same
/// 1 to 20 drafts each (cache_seqlens count both), one query per draft (varlen: cu_seqlens_q
/// steps of `tokens`, spare rows after), float Q and pools, every layout and option but the
/// mask (the tree is the mask; top-k, MLA and plans do not apply), rotary of Q, NaN/Inf.
void build_tree_problem(FuzzedDataProvider& in, Problem& p, TreeDraw& t, std::mt19937& rng) {
  p.kv = KvType::fp32;
  p.qt = QType::fp32;
  p.varlen = in.ConsumeBool();
  p.lse_on = in.ConsumeBool();
  p.hkv = in.ConsumeIntegralInRange(1, 3);
  p.hq = p.hkv * in.ConsumeIntegralInRange<index_t>(1, 6 / p.hkv);
  p.d = in.ConsumeIntegralInRange(1, 72);
  p.dv = in.ConsumeBool() ? p.d : in.ConsumeIntegralInRange(1, 40);
  p.batch = in.ConsumeIntegralInRange(1, 3);
  t.tokens = in.ConsumeIntegralInRange(1, 20);
  p.cu = {0};
  for (index_t b = 0; b < p.batch; ++b) {
    const int prefix = in.ConsumeIntegralInRange(0, 5) == 0 ? 0 : in.ConsumeIntegralInRange(1, 60);
    p.seqlens.push_back(static_cast<std::int32_t>(prefix + t.tokens));
    p.longest_k = std::max<index_t>(p.longest_k, p.seqlens.back());
    p.cu.push_back(static_cast<std::int32_t>(p.cu.back() + t.tokens));
  }
  p.longest_q = t.tokens;
  p.nq = p.varlen ? p.cu.back() + in.ConsumeIntegralInRange(0, 2) : t.tokens;
  // The trees: each token a root now and then (a forest), else a child of an earlier one;
  // sometimes a chain (each the next's parent: the tree is the causal mask).
  const index_t trees = p.batch > 1 && in.ConsumeBool() ? p.batch : 1;
  for (index_t tree = 0; tree < trees; ++tree) {
    const bool chain = in.ConsumeIntegralInRange(0, 3) == 0;
    for (index_t x = 0; x < t.tokens; ++x)
      t.parents.push_back(x == 0 ? -1
                          : chain ? static_cast<std::int32_t>(x - 1)
                          : in.ConsumeIntegralInRange(0, 4) == 0 ? -1
                                                                 : in.ConsumeIntegralInRange<std::int32_t>(0, static_cast<std::int32_t>(x - 1)));
  }
  const BlockSize blocks[] = {{}, {1, 1}, {4, 8}, {16, 32}, {16, 64}};
  const int pick = in.ConsumeIntegralInRange(0, 5);
  t.block = pick < 5 ? blocks[pick] : BlockSize{in.ConsumeIntegralInRange<index_t>(1, 21), in.ConsumeIntegralInRange<index_t>(1, 70)};
  build_pages(in, p, rng);
  draw_queries(in, p, rng);
  build_options(in, p, rng);
  p.mask.reset();
  p.opts.mask = {};
  for (Relayout& r : p.layout) r = relayout_of(in.ConsumeIntegral<std::uint8_t>());
  p.lse_layout = in.ConsumeIntegralInRange(0, 1);
  const auto flags = in.ConsumeIntegral<std::uint8_t>();
  p.rerun = flags & 1;
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[(flags >> 1) & 3];
  if (!backend_available(backend)) backend = Backend::serial;
  p.again = {backend, (flags >> 3) & 3};
  build_rotary(in, p, rng);
  t.mask_parents = t.parents;
  t.mask_seqlens = p.seqlens;
  t.mask_tokens = t.tokens;
}

/// One corruption of the mask (about half the inputs; the rest of the choices leave it
/// valid): draft_tree_mask's own bad arguments (a parent not earlier, a parent below -1,
/// the wrong count, tokens 0, fewer keys than drafts, no sequences), which it must reject,
/// or a valid mask made for another call, which forward_paged_flex must reject naming
/// block_mask: other cache_seqlens (one sequence's keys moved, the longest kept or not), a
/// smaller or larger batch, other draft counts.
void corrupt_tree(FuzzedDataProvider& in, const Problem& p, TreeDraw& t) {
  const index_t trees = static_cast<index_t>(t.parents.size()) / t.tokens;
  const auto tree_parents = [&](index_t count, index_t tokens) {  // `count` trees of `tokens` drafts, valid
    std::vector<std::int32_t> out;
    for (index_t tree = 0; tree < count; ++tree)
      for (index_t x = 0; x < tokens; ++x)
        out.push_back(x < t.tokens ? t.parents[static_cast<std::size_t>((tree % trees) * t.tokens + x)] : static_cast<std::int32_t>(x - 1));
    return out;
  };
  switch (17 - in.ConsumeIntegralInRange(0, 17)) {  // (an input out of bytes reads 0: none)
    case 0: {  // a parent that is not an earlier token (itself or later), or below -1
      const index_t e = in.ConsumeIntegralInRange<index_t>(0, static_cast<index_t>(t.mask_parents.size()) - 1), x = e % t.tokens;
      const std::int32_t bad[] = {static_cast<std::int32_t>(x), static_cast<std::int32_t>(x + 1), INT_MAX, -2, INT_MIN};
      t.mask_parents[static_cast<std::size_t>(e)] = bad[in.ConsumeIntegralInRange(0, 4)];
      t.corruption = "parents entry " + std::to_string(e) + " is " + std::to_string(t.mask_parents[static_cast<std::size_t>(e)]);
      t.mask_rejected = true;
      return;
    }
    case 1:
      if (in.ConsumeBool()) t.mask_parents.push_back(-1);
      else t.mask_parents.pop_back();
      t.corruption = "parents count " + std::to_string(t.mask_parents.size());
      t.mask_rejected = true;
      return;
    case 2:
      t.mask_tokens = in.ConsumeBool() ? 0 : -1;
      t.corruption = "tokens " + std::to_string(t.mask_tokens);
      t.mask_rejected = true;
      return;
    case 3: {
      const index_t b = in.ConsumeIntegralInRange<index_t>(0, p.batch - 1);
      t.mask_seqlens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(t.tokens - in.ConsumeIntegralInRange<index_t>(1, t.tokens + 1));
      t.corruption = "cache_seqlens[" + std::to_string(b) + "] below tokens";
      t.mask_rejected = true;
      return;
    }
    case 4:
      t.mask_seqlens.clear();
      t.corruption = "cache_seqlens empty";
      t.mask_rejected = true;
      return;
    case 5: case 6: {  // one sequence's keys moved (still >= tokens): the drafts at other positions
      const index_t b = in.ConsumeIntegralInRange<index_t>(0, p.batch - 1);
      std::int32_t& len = t.mask_seqlens[static_cast<std::size_t>(b)];
      const auto step = in.ConsumeIntegralInRange<std::int32_t>(1, 3);
      len = len - step >= t.tokens && in.ConsumeBool() ? len - step : len + step;
      t.corruption = "mask for cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(len);
      return;
    }
    case 7: case 8:  // made for fewer sequences (a tree of one broadcast, or the first ones')
      if (p.batch < 2) return;
      {
        const index_t k = in.ConsumeIntegralInRange<index_t>(1, p.batch - 1);
        t.mask_seqlens.resize(static_cast<std::size_t>(k));
        t.mask_parents = tree_parents(trees > 1 ? k : 1, t.tokens);
        t.corruption = "mask for a batch of " + std::to_string(k);
      }
      return;
    case 9:  // made for one sequence more
      t.mask_seqlens.push_back(static_cast<std::int32_t>(t.tokens + in.ConsumeIntegralInRange(0, 9)));
      t.mask_parents = tree_parents(trees > 1 ? p.batch + 1 : 1, t.tokens);
      t.corruption = "mask for a batch of " + std::to_string(p.batch + 1);
      return;
    case 10: {  // other draft counts over the same keys (the call's queries are `tokens`)
      const index_t shortest = *std::min_element(p.seqlens.begin(), p.seqlens.end());
      const index_t other = in.ConsumeBool() && t.tokens > 1 ? t.tokens - 1 : std::min<index_t>(t.tokens + 1, shortest);
      if (other == t.tokens) return;
      t.mask_tokens = other;
      t.mask_parents = tree_parents(trees, other);
      t.corruption = "mask for " + std::to_string(other) + " drafts";
      return;
    }
    default: return;  // none
  }
}

/// The tree as the reference's dense mask [batch, 1, tokens, longest cache_seqlens]: query t
/// of sequence b sees key j < prefix(b), or j - prefix(b) when that is t or an ancestor.
std::unique_ptr<bool[]> dense_tree_mask(const Problem& p, const TreeDraw& t, ScoreMaskView& view) {
  const index_t trees = static_cast<index_t>(t.parents.size()) / t.tokens, sk = p.longest_k, sq = t.tokens;
  std::unique_ptr<bool[]> m(new bool[static_cast<std::size_t>(p.batch * sq * sk)]());
  for (index_t b = 0; b < p.batch; ++b) {
    const index_t prefix = p.seqlens[static_cast<std::size_t>(b)] - t.tokens;
    const std::int32_t* tree = t.parents.data() + (trees > 1 ? b : 0) * t.tokens;
    for (index_t x = 0; x < sq; ++x)
      for (index_t j = 0; j < p.seqlens[static_cast<std::size_t>(b)]; ++j)
        m[static_cast<std::size_t>((b * sq + x) * sk + j)] = j < prefix || is_ancestor(tree, j - prefix, x);
  }
  view = {m.get(), {p.batch, 1, sq, sk}, {sq * sk, sq * sk, sk, 1}};
  return m;
}

void execute_tree(FuzzedDataProvider& in, bool verbose, std::mt19937& rng) {
  Problem p;
  TreeDraw t;
  build_tree_problem(in, p, t, rng);
  const int choice = in.ConsumeIntegralInRange(0, 2 * corruption_count - 1);
  const bool mask_fault = choice % 2 == 0;  // half the corruptions are the mask's, half the call's
  if (choice < corruption_count && mask_fault) corrupt_tree(in, p, t);
  Call<float, float> c = make_call<float, float>(p);
  std::string what = t.corruption;
  if (choice < corruption_count && !mask_fault && choice != plan_mismatch) what = corrupt(choice, in, p, c);
  const bool corrupted = what != "none";
  p.applied = what;
  std::string info = "draft tree of " + std::to_string(t.tokens) + " (" +
                     std::to_string(t.parents.size() / static_cast<std::size_t>(t.tokens)) + " trees, block " +
                     std::to_string(t.block.q) + "x" + std::to_string(t.block.kv) + ") parents";
  for (auto x : t.parents) info += " " + std::to_string(x);
  info += "\n  " + describe(p, what, {c.q.view.stride.data(), c.k.view.stride.data(), c.v.view.stride.data(), c.o.view.stride.data()});
  if (verbose) std::fprintf(stderr, "paged_fuzz: %s\n", info.c_str());
  std::optional<BlockMask<flex::draft_tree>> mask;
  try {
    mask.emplace(draft_tree_mask(t.mask_parents, t.mask_tokens, t.mask_seqlens, t.block));
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("paged_fuzz", err);
    if (!t.mask_rejected) fail(std::string("draft_tree_mask rejected a valid tree: ") + err.what() + "\n  " + info);
    if (verbose) std::fprintf(stderr, "paged_fuzz: draft_tree_mask rejected (%s)\n", err.what());
    return;
  }
  if (t.mask_rejected) fail("draft_tree_mask accepted bad arguments\n  " + info);
  const auto call = [&](const PagedOptions& opts) {
    if (p.varlen)
      forward_paged_flex_varlen(pack(c.qv), c.kv, c.vv, c.table, c.seqlens, pack(c.ov), c.lse2, c.cu,
                                flex::no_score_mod{}, *mask, opts);
    else
      forward_paged_flex(c.qv, c.kv, c.vv, c.table, c.seqlens, c.ov, c.lse3, flex::no_score_mod{}, *mask, opts);
  };
  if (!attempt_call(p, c, corrupted, info, [&] { call(c.opts); })) {
    if (verbose) std::fprintf(stderr, "paged_fuzz: rejected\n");
    return;
  }
  // The reference: the same options with the tree as a dense mask.
  ScoreMaskView dense{};
  const auto dense_data = dense_tree_mask(p, t, dense);
  const PagedOptions flex_opts = c.opts;
  c.opts.mask = dense;
  check_success(p, c, info, verbose);
  if (p.rerun) {  // the same bits on another backend and thread count
    const std::vector<float> first_o = c.o.data, first_lse = c.lse;
    std::fill(c.o.data.begin(), c.o.data.end(), sentinel);
    std::fill(c.lse.begin(), c.lse.end(), sentinel);
    PagedOptions again = flex_opts;
    again.execution = p.again;
    call(again);
    if (!same_bits(first_o, c.o.data) || !same_bits(first_lse, c.lse)) fail("results differ between executions\n  " + info);
  }
  if (verbose) std::fprintf(stderr, "paged_fuzz: ok\n");
}

}  // namespace

/// The 4-bit tag's variant of a 4-bit problem (file comment): read from the input's first
/// five bytes, apart from the provider, so inputs without the tag decode as they always did.
FourBit four_bit_variant(const std::uint8_t* data, std::size_t size, const Problem& p) {
  constexpr std::uint8_t tag[4] = {'t', 'p', '4', 'h'};
  if (!four_bit(p.kv) || size < 5 || std::memcmp(data, tag, 4) != 0) return FourBit::as_drawn;
  const bool powers_of_two = ops::hadamard_length(p.d) && ops::hadamard_length(p.dv);
  if (p.kv == KvType::nvfp4) return data[4] % 2 == 1 && powers_of_two ? FourBit::rotated_nvfp4 : FourBit::as_drawn;
  const auto v = static_cast<FourBit>(data[4] % 4);
  return v >= FourBit::rotated_q4_0 && !powers_of_two ? FourBit::as_drawn : v;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool verbose = std::getenv("PAGED_FUZZ_VERBOSE") != nullptr;
  constexpr std::uint8_t tree_tag[4] = {'t', 'p', 't', 'r'};
  if (size >= 4 && std::memcmp(data, tree_tag, 4) == 0) {  // the tree tag: the bytes after it
    FuzzedDataProvider in(data + 4, size - 4);
    std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
    execute_tree(in, verbose, rng);
    return 0;
  }
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  Problem p;
  build(in, p, rng);
  p.corruption = choose_corruption(in);
  switch (p.kv) {
    case KvType::fp32: execute<float, float>(in, p, verbose); break;
    case KvType::bf16: execute<bf16, bf16>(in, p, verbose); break;
    case KvType::fp16: execute<fp16, fp16>(in, p, verbose); break;
    case KvType::int8: execute_q<std::int8_t>(in, p, verbose); break;
    case KvType::e4m3: execute_q<fp8_e4m3>(in, p, verbose); break;
    case KvType::e5m2: execute_q<fp8_e5m2>(in, p, verbose); break;
    case KvType::q4_0:
      switch (p.four_bit = four_bit_variant(data, size, p)) {
        case FourBit::mxfp4: execute<float, mxfp4_block>(in, p, verbose); break;
        case FourBit::rotated_q4_0: execute<float, hadamard_rotated<q4_0_block>>(in, p, verbose); break;
        case FourBit::rotated_mxfp4: execute<float, hadamard_rotated<mxfp4_block>>(in, p, verbose); break;
        default: execute<float, q4_0_block>(in, p, verbose); break;
      }
      break;
    case KvType::nvfp4:
      p.four_bit = four_bit_variant(data, size, p);
      if (p.four_bit == FourBit::rotated_nvfp4) execute<float, hadamard_rotated<nvfp4_block>>(in, p, verbose);
      else execute<float, nvfp4_block>(in, p, verbose);
      break;
  }
  return 0;
}
