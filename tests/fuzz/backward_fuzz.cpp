// tests/fuzz/backward_fuzz.cpp: libFuzzer harness for tileattn::backward and backward_varlen.
//
// The fuzzer's bytes choose everything a caller can: fixed-length or packed varlen batches
// (empty sequences, rows past the last sequence), shapes (head_dim and head_dim_v apart, GQA
// groups), the storage type (float, bf16, fp16), where each of the eight tensors sits (Q, K,
// V, O, dO, dQ, dK, dV: padded rows, [B, H, N, D], stride-0 broadcast K/V, then maybe a fresh
// layout: four dimension orders, innermost stride 1 or 2, gaps after each dimension, data
// shifted 0 to 3 elements), a padded or packed LSE, every option (causal and both
// alignments, windows up to INT64_MAX, softcap from subnormal to 2e38, scales, ALiBi,
// sinks with or without dsinks, bias with or without dbias (broadcast dimensions, padded
// dbias rows), mask, dropout), the SRAM budget, backend and thread count, IO counting, NaN
// and Inf at chosen elements of Q, K, V and dO, and then one corruption from a list of bad
// arguments (or none; varlen: cu_seqlens stored in a gradient's memory among them). O and the LSE come from tileattn::forward on the same inputs and options (its
// default budget: the backward's budget is the backward's own), run before the corruption.
// Each backward call must either throw tileattn::invalid_argument naming its parameter with
// dQ, dK, dV, dsinks, dbias and the IO counts untouched (bitwise), or write gradients that
// match the double-precision reference (tests/reference/naive_backward.hpp; the NaN pattern
// exactly) within the bound below, writing nothing outside the gradient views and no input.
// A flags byte may ask for a second run on another backend, thread count and SRAM budget,
// which must give bitwise-identical gradients (docs/backward.md promises it).
// Anything else aborts (a crash, a sanitizer report, another exception, a wrong result).
//
// Bounds: FlashAttention's rule, as tests/kernels/backward_test.cpp runs it: per gradient
// tensor (dQ, dK, dV, dsinks, dbias), with M the largest |reference| entry and N the largest
// error of the naive same-precision backward (attention_backward_naive<T>: every
// intermediate materialized and rounded to T, as PyTorch eager),
//   float:      error <= 3 N + 2e-5 M          (the suite's tight float term, not 2e-4)
//   bf16, fp16: error <= 3 max(N, u M) + 2e-4 M (u = 2^-8, 2^-11: a naive error below one
//                                                rounding of the gradient is luck)
// plus a floor for gradients that cancel to (nearly) zero, where M and N say nothing about
// the rounding of the terms that cancelled (one key: dS = P (dP - D) is exactly 0 in double
// and in the naive code, P = 1 and D = dP bit for bit, but not in a kernel that forms P as
// 2^(s - LSE) and sums D in another order): floor = 8 u' F, with F the same gradient's
// magnitude computed from absolute values (|dP| + |D| for dP - D; see term_magnitudes) and
// u' = 2^-24 for float or the type's u (O, from which D is summed, is stored in T).
// Shapes stay small (N <= 40 per sequence, d <= 72, heads <= 6); an input still costs
// about 25 ms under ASan + UBSan (three references besides the kernel), so CI runs a sixth
// of TILEATTN_FUZZ_RUNS (tests/fuzz/CMakeLists.txt).
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target backward_fuzz
//   build-fuzz/tests/fuzz/backward_fuzz tests/fuzz/corpus/backward -max_len=512 -max_total_time=3600
// BACKWARD_FUZZ_VERBOSE=1 prints what each input decodes to and its errors:
// build-fuzz/tests/fuzz/backward_fuzz FILE...   (docs/reliability.md has the rest.)
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
#include "fuzz/fuzz_support.hpp"
#include "support/backward_support.hpp"
#include "support/test_support.hpp"

namespace {

using namespace tileattn;
using tileattn::test::GradError;
using tileattn::test::sentinel;

using fuzz::all_bits_equal;
using fuzz::Buffer;
using fuzz::make_stored;
using fuzz::mirror;
using fuzz::Relayout;
using fuzz::relayout_of;
using fuzz::Stored;
using fuzz::changed_outside;
using fuzz::inf;
using fuzz::nan;
using fuzz::same_bits;
using fuzz::attention_chunk;
using fuzz::window_side;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("backward_fuzz", what); }


Buffer make_tensor(FuzzedDataProvider& in, index_t b, index_t n, index_t h, index_t d, bool allow_broadcast,
                   std::mt19937& rng) {
  Buffer t;
  const int layout = in.ConsumeIntegralInRange(0, allow_broadcast ? 3 : 2);
  switch (layout) {
    case 0:  // contiguous [B, N, H, D]
      t.data.resize(std::max<std::size_t>(static_cast<std::size_t>(b * n * h * d), 1));
      t.view = make_bshd(t.data.data(), b, n, h, d);
      break;
    case 1:  // [B, H, N, D]
      t.data.resize(std::max<std::size_t>(static_cast<std::size_t>(b * n * h * d), 1));
      t.view = make_bhsd(t.data.data(), b, h, n, d);
      break;
    case 2: {  // rows 2.. of a padded [B, N + 3, H, D + 5] buffer
      const index_t rows = n + 3, dp = d + 5;
      t.data.resize(static_cast<std::size_t>(b * rows * h * dp));
      t.view = {t.data.data() + 2 * h * dp, {b, n, h, d}, {rows * h * dp, h * dp, dp, 1}};
      break;
    }
    default:  // one row broadcast over the sequence (stride 0)
      t.data.resize(static_cast<std::size_t>(b * h * d));
      t.view = {t.data.data(), {b, n, h, d}, {h * d, 0, d, 1}};
      break;
  }
  std::normal_distribution<float> normal;
  for (float& x : t.data) x = normal(rng);
  return t;
}

/// Puts up to three NaN or Inf values at chosen elements of a tensor (when the input asks).
/// `where` gets " name[index] = value" for each (printed with a failure).
void poison(FuzzedDataProvider& in, Buffer& t, const char* name, std::string& where) {
  const int count = in.ConsumeIntegralInRange(0, 3) * (in.ConsumeIntegralInRange(0, 7) == 0);
  const float values[] = {nan, inf, -inf};
  for (int i = 0; i < count && !t.data.empty(); ++i) {
    const auto at = in.ConsumeIntegralInRange<std::size_t>(0, t.data.size() - 1);
    t.data[at] = values[in.ConsumeIntegralInRange(0, 2)];
    where += std::string(" ") + name + "[" + std::to_string(at) + "] = " + std::to_string(t.data[at]);
  }
}

// ---- Final layouts ----------------------------------------------------------------------

/// The names of fuzz::orders for the eight tensors, in failure messages.
constexpr const char* order_names[] = {"bshd", "bhsd", "bhds", "sbdh"};

enum class Storage { fp32, bf16, fp16 };

/// The eight tensors of a call, in the order of Problem::layout.
enum Tensor { tq, tk, tv, to, tdo, tdq, tdk, tdv, tensor_count };
constexpr const char* tensor_names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};

struct Problem {
  bool varlen = false;
  index_t batch = 1, nq = 1, nk = 1, hq = 1, hkv = 1, d = 1, dv = 1;
  std::vector<std::int32_t> cu_q, cu_k;
  const std::int32_t *cu_q_at = nullptr, *cu_k_at = nullptr;  // when set, the call reads cu_q / cu_k there
  index_t max_q = 0, max_k = 0;
  std::array<Buffer, tensor_count> t;  // as generated, in float (O and the gradients: sentinel)
  std::vector<float> lse;              // sentinel outside the view
  LseView lse_view{};
  BackwardOptions opts;
  std::vector<float> slopes, sinks, bias, dsinks, dbias;  // dsinks: one spare entry each side
  std::unique_ptr<bool[]> mask;
  IoCounts counts{7, 7};
  std::string poisoned;  // the NaN and Inf put into the inputs (generated buffers)
  int budget_choice = 0;
  std::size_t budget_bytes = 0;
  Storage type = Storage::fp32;
  std::array<Relayout, tensor_count> layout{};
  bool rerun = false;  // run again on `again` with `again_budget`; results must be bitwise equal
  Execution again{};
  int again_budget_choice = 0;
};

/// Varlen sequence lengths, or the fixed batch, from the input.
void build_shapes(FuzzedDataProvider& in, Problem& p) {
  p.varlen = in.ConsumeBool();
  p.hkv = in.ConsumeIntegralInRange(1, 3);
  p.hq = p.hkv * in.ConsumeIntegralInRange(1, 2);
  p.d = in.ConsumeIntegralInRange(1, 72);
  p.dv = in.ConsumeBool() ? p.d : in.ConsumeIntegralInRange(1, 40);
  if (!p.varlen) {
    p.batch = in.ConsumeIntegralInRange(1, 2);
    p.nq = in.ConsumeIntegralInRange(1, 40);
    p.nk = in.ConsumeIntegralInRange(1, 40);
    return;
  }
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
  // Packed rows: the sequences', then 0 to 2 rows no sequence covers (at least one row).
  p.nq = std::max<index_t>(p.cu_q.back() + in.ConsumeIntegralInRange(0, 2), 1);
  p.nk = std::max<index_t>(p.cu_k.back() + in.ConsumeIntegralInRange(0, 2), 1);
}

/// The forward's options plus dsinks and dbias, the budget choice, backend and threads.
void build_options(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  BackwardOptions& o = p.opts;
  o.causal = in.ConsumeBool();
  o.alignment = in.ConsumeBool() ? MaskAlignment::bottom_right : MaskAlignment::top_left;
  o.window_left = window_side(in);
  o.window_right = window_side(in);
  o.attention_chunk = attention_chunk(in);
  o.batch_invariant = in.ConsumeIntegralInRange(0, 3) == 0;
  // The largest valid softcap is FLT_MAX / log2(e) (about 2.36e38; FLT_MAX is corruption 27).
  const float caps[] = {0.0f, 0.0f, 5.0f, 30.0f, 2e38f, 1e-40f};
  o.softcap = caps[in.ConsumeIntegralInRange(0, 5)];
  if (in.ConsumeBool()) o.softmax_scale = in.ConsumeFloatingPointInRange(0.01f, 1.0f);
  const index_t seq_count = p.batch;
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    p.slopes.resize(static_cast<std::size_t>(in.ConsumeBool() ? p.hq : seq_count * p.hq));
    for (float& s : p.slopes) s = in.ConsumeFloatingPointInRange(0.0f, 2.0f);
    o.alibi_slopes = p.slopes;
  }
  if (in.ConsumeIntegralInRange(0, 2) == 0) {
    p.sinks.resize(static_cast<std::size_t>(p.hq));
    for (float& s : p.sinks) s = in.ConsumeBool() ? -inf : in.ConsumeFloatingPointInRange(-5.0f, 5.0f);
    o.sinks = p.sinks;
    if (in.ConsumeBool()) {
      p.dsinks.assign(static_cast<std::size_t>(p.hq + 2), sentinel);
      o.dsinks = std::span<float>(p.dsinks).subspan(1, static_cast<std::size_t>(p.hq));
    }
  }
  const index_t sq = p.varlen ? p.max_q : p.nq, sk = p.varlen ? p.max_k : p.nk;
  const index_t bb = in.ConsumeBool() ? 1 : seq_count, bh = in.ConsumeBool() ? 1 : p.hq;
  const std::array<index_t, 4> score_shape{bb, bh, sq, sk};
  const std::array<index_t, 4> score_stride{bh * sq * sk, sq * sk, sk, 1};
  if (in.ConsumeIntegralInRange(0, 2) == 0) {
    p.bias.resize(static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * sk, 1)));
    std::normal_distribution<float> normal;
    for (float& x : p.bias) x = in.ConsumeIntegralInRange(0, 50) == 0 ? nan : normal(rng);
    o.bias = {p.bias.data(), score_shape, score_stride};
    if (in.ConsumeBool()) {  // dbias, its rows maybe one element apart (the gaps keep the sentinel)
      const index_t row = sk + in.ConsumeIntegralInRange(0, 1);
      p.dbias.assign(static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * row, 1)), sentinel);
      o.dbias = {p.dbias.data(), score_shape, {bh * sq * row, sq * row, row, 1}};
    }
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) {
    const auto n = static_cast<std::size_t>(std::max<index_t>(bb * bh * sq * sk, 1));
    p.mask.reset(new bool[n]);
    for (std::size_t i = 0; i < n; ++i) p.mask[i] = (rng() % 4) != 0;
    o.mask = {p.mask.get(), score_shape, score_stride};
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0)  // dropout (p small: the error bounds hold at 1 / (1 - p))
    o.dropout = {in.ConsumeBool() ? 0.1f : 0.25f, rng(), in.ConsumeIntegral<std::uint32_t>()};
  p.budget_choice = in.ConsumeIntegralInRange(0, 3);
  p.budget_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 1u << 20);
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[in.ConsumeIntegralInRange(0, 3)];
  if (!backend_available(backend)) backend = Backend::serial;
  o.execution = {backend, in.ConsumeIntegralInRange(0, 3)};
  if (in.ConsumeBool()) o.io_counts = &p.counts;
}

/// Storage type, the final layouts of the eight tensors and of the LSE, the rerun flags.
void build_layouts(FuzzedDataProvider& in, Problem& p) {
  p.type = static_cast<Storage>(in.ConsumeIntegralInRange(0, 2));
  for (Relayout& r : p.layout) r = relayout_of(in.ConsumeIntegral<std::uint8_t>());
  const auto flags = in.ConsumeIntegral<std::uint8_t>();
  p.rerun = flags & 1;
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[(flags >> 1) & 3];
  if (!backend_available(backend)) backend = Backend::serial;
  p.again = {backend, (flags >> 3) & 3};
  p.again_budget_choice = (flags >> 5) & 3;
  // The LSE: [B, H, N] (packed: [H, N]) with a gap of 0 to 3 floats after each row.
  const index_t vb = p.varlen ? 1 : p.batch, gap = (flags >> 7) ? in.ConsumeIntegralInRange(1, 3) : 0;
  const index_t row = p.nq + gap;
  p.lse.assign(static_cast<std::size_t>(vb * p.hq * row), sentinel);
  p.lse_view = {p.lse.data(), {vb, p.hq, p.nq}, {p.hq * row, row, 1}};
}

/// Shapes, tensors and options from the input: a valid call (corrupted later, maybe).
void build(FuzzedDataProvider& in, Problem& p, std::mt19937& rng) {
  build_shapes(in, p);
  const index_t vb = p.varlen ? 1 : p.batch;
  const std::array<index_t, tensor_count> rows{p.nq, p.nk, p.nk, p.nq, p.nq, p.nq, p.nk, p.nk};
  const std::array<index_t, tensor_count> heads{p.hq, p.hkv, p.hkv, p.hq, p.hq, p.hq, p.hkv, p.hkv};
  const std::array<index_t, tensor_count> dims{p.d, p.d, p.dv, p.dv, p.dv, p.d, p.d, p.dv};
  for (int i = 0; i < tensor_count; ++i) {
    const bool broadcast = !p.varlen && (i == tk || i == tv);  // only K and V may broadcast
    p.t[static_cast<std::size_t>(i)] = make_tensor(in, vb, rows[static_cast<std::size_t>(i)],
                                                   heads[static_cast<std::size_t>(i)],
                                                   dims[static_cast<std::size_t>(i)], broadcast, rng);
  }
  for (int i : {tq, tk, tv, tdo}) poison(in, p.t[static_cast<std::size_t>(i)], tensor_names[i], p.poisoned);
  for (int i : {to, tdq, tdk, tdv}) std::fill(p.t[static_cast<std::size_t>(i)].data.begin(),
                                              p.t[static_cast<std::size_t>(i)].data.end(), sentinel);
  build_options(in, p, rng);
  build_layouts(in, p);
}

// ---- Tensors in the storage type --------------------------------------------------------


template <class T>
using Tensors = std::array<Stored<T>, tensor_count>;

template <class T>
PackedView<T> packed(const TensorView<T>& v) {
  return {v.data, {v.shape[1], v.shape[2], v.shape[3]}, {v.stride[1], v.stride[2], v.stride[3]}};
}

template <class T>
TensorView<const T> in_view(const Tensors<T>& t, int i) {
  return t[static_cast<std::size_t>(i)].view;
}

// ---- Bad arguments ----------------------------------------------------------------------

/// One bad argument (or none): the call must then throw invalid_argument, writing nothing.
int choose_corruption(FuzzedDataProvider& in) { return in.ConsumeIntegralInRange(0, 39); }

/// A copy of `lengths` at the first element of an output's view (nullptr when its buffer
/// ends too soon, or that element is not 4-byte aligned: a 16-bit view may start anywhere).
template <class T>
const std::int32_t* lengths_in(const std::vector<std::int32_t>& lengths, Stored<T>& out) {
  const std::size_t bytes = lengths.size() * sizeof(std::int32_t);
  const auto first = static_cast<std::size_t>(out.view.data - out.data.data());
  if ((out.data.size() - first) * sizeof(T) < bytes ||
      reinterpret_cast<std::uintptr_t>(out.view.data) % alignof(std::int32_t) != 0)
    return nullptr;
  std::memcpy(out.view.data, lengths.data(), bytes);
  return reinterpret_cast<const std::int32_t*>(out.view.data);
}

/// A few corruptions are bad only for some shapes or options (marked "maybe"); when they
/// leave the call valid it must succeed like any other.
template <class T>
void corrupt(int choice, Problem& p, Tensors<T>& t, std::vector<float>& spare) {
  // Two rows this far apart span 2^63 bytes or more: past PTRDIFF_MAX, whatever the type.
  constexpr auto stride_past_ptrdiff_max = static_cast<index_t>((std::uint64_t{1} << 63) / sizeof(T));
  BackwardOptions& o = p.opts;
  const auto view = [&](int i) -> TensorView<T>& { return t[static_cast<std::size_t>(i)].view; };
  switch (choice) {
    case 0: view(tdo).shape[1] += 1; break;                                 // dO rows != O rows
    case 1: view(tdq).shape[3] += 1; break;                                 // dQ head_dim
    case 2: view(tdk).shape[2] += 1; break;                                 // dK heads
    case 3: view(tdv).shape[3] += 1; break;                                 // dV head_dim_v
    case 4: view(to).shape[1] += 1; break;                                  // O rows != Q rows
    case 5: view(tdq).stride[1] = -1; break;                                // negative stride
    case 6: view(tdk).stride[1] = stride_past_ptrdiff_max; break;           // address range overflow
    case 7: view(tdv).shape[1] = index_t{1} << 62; break;                   // element count overflow
    case 8: view(tdq).data = const_cast<T*>(view(tq).data); break;          // dQ aliases Q
    case 9: view(tdk).data = view(tdq).data; break;                         // dK aliases dQ
    case 10: view(tdv).data = const_cast<T*>(view(to).data); break;         // dV aliases O
    case 11: view(tdq).data = nullptr; break;
    case 12: p.lse_view.data = nullptr; break;                              // no saved LSE
    case 13: p.lse_view.shape[2] += 1; break;                               // LSE rows != Q rows
    case 14:  // dsinks one entry too many, or set without sinks
      o.dsinks = o.sinks.empty() ? std::span<float>(spare).first(static_cast<std::size_t>(p.hq))
                                 : std::span<float>(p.dsinks);
      break;
    case 15:  // dbias of another shape, or set without a bias
      if (o.dbias.data) o.dbias.shape[2] += 1;
      else if (!o.bias.data) o.dbias = {spare.data(), {1, 1, 1, 1}, {1, 1, 1, 1}};
      else o.dbias = {spare.data(), {1, 1, 1, o.bias.shape[3] + 1}, {1, 1, 1, 1}};  // wrong keys
      break;
    case 16:  // dbias aliases the bias (or, without one, dQ overlaps itself: maybe)
      if (o.dbias.data) o.dbias.data = const_cast<float*>(o.bias.data);
      else view(tdq).stride[1] = 0;
      break;
    case 17: o.softmax_scale = -1.0f; break;
    case 18: (p.nq % 2 ? o.window_left : o.attention_chunk) = -3; break;
    case 19: o.softcap = inf; break;
    case 20: o.sram_budget_bytes = 64; break;                               // below 1 x 1 tiles
    case 21: o.execution.num_threads = -1; break;
    case 22:
      if (p.varlen && p.cu_q.size() > 2) std::swap(p.cu_q[1], p.cu_q[2]);   // maybe decreasing
      else view(tk).shape[3] += 1;                                          // K head_dim != Q's
      break;
    case 23:
      if (p.varlen) p.cu_k.back() += 5;                                     // past the packed rows
      else view(tq).data = nullptr;
      break;
    case 24:
      if (p.varlen) p.max_q = std::max<index_t>(p.max_q - 1, 0);            // maybe below a length
      else view(tdo).stride[3] = -2;
      break;
    case 25:  // dsinks aliases the sinks (or, without them, dV aliases dK)
      if (!o.dsinks.empty()) o.dsinks = {const_cast<float*>(o.sinks.data()), o.sinks.size()};
      else view(tdv).data = view(tdk).data;
      break;
    case 26: view(tdv).data = const_cast<T*>(view(tdo).data); break;        // dV aliases dO
    case 27: o.softcap = std::numeric_limits<float>::max(); break;         // softcap * log2(e) overflows
    case 30: o.dropout = {0.5f, 1, std::uint64_t{1} << 32}; break;          // dropout.offset past 32 bits
    case 28:  // varlen: cu_seqlens_q stored in dQ's memory (issue 27, N1)
      if (p.varlen) p.cu_q_at = lengths_in(p.cu_q, t[tdq]);
      break;
    case 29:  // varlen: cu_seqlens_k stored in dK's or dV's memory (maybe: when it fits)
      if (p.varlen) p.cu_k_at = lengths_in(p.cu_k, t[p.cu_k.size() % 2 ? tdk : tdv]);
      break;
    default: break;  // no corruption
  }
}

// ---- Description --------------------------------------------------------------------------

template <class T>
std::string layout_of(const char* name, const Stored<T>& s, const Relayout& r) {
  std::string out = std::string(" ") + name + (r.fresh ? std::string(" ") + order_names[r.order] : std::string(" gen")) +
                    " +" + std::to_string(r.shift) + " strides";
  for (index_t x : s.view.stride) out += " " + std::to_string(x);
  return out;
}

/// What the failing input asked for, printed with a failure.
template <class T>
std::string describe(const Problem& p, const Tensors<T>& t) {
  const BackwardOptions& o = p.opts;
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
                  " dsinks " + std::to_string(o.dsinks.size()) + " bias " + std::to_string(p.bias.size()) +
                  " dbias " + std::to_string(o.dbias.data != nullptr) + " mask " + std::to_string(p.mask != nullptr) +
                  " budget " + std::to_string(o.sram_budget_bytes) + " backend " + to_string(o.execution.backend) +
                  " x " + std::to_string(o.execution.num_threads) + " io " + std::to_string(o.io_counts != nullptr) +
                  " lse row stride " + std::to_string(p.lse_view.stride[1]);
  if (p.varlen) {
    s += " cu_q";
    for (auto x : p.cu_q) s += " " + std::to_string(x);
    s += " cu_k";
    for (auto x : p.cu_k) s += " " + std::to_string(x);
    s += " max " + std::to_string(p.max_q) + "," + std::to_string(p.max_k);
  }
  if (!p.poisoned.empty()) s += "\n  non-finite:" + p.poisoned;
  s += "\n  layouts:";
  for (int i = 0; i < tensor_count; ++i)
    s += layout_of(tensor_names[i], t[static_cast<std::size_t>(i)], p.layout[static_cast<std::size_t>(i)]) + ";";
  if (p.rerun)
    s += "\n  rerun on " + std::string(to_string(p.again.backend)) + " x " + std::to_string(p.again.num_threads) +
         ", budget choice " + std::to_string(p.again_budget_choice);
  return s;
}

// ---- The calls ----------------------------------------------------------------------------

/// The SRAM budget a choice stands for: the default, tiles of 3 x 5 or 16 x 32 (bf16 pair
/// operands, whose tiles are multiples of 32: 32 x 32 or 32 x 64), or any.
template <class T>
std::size_t budget_for(const Problem& p, int choice) {
  constexpr TileOperands ops = kernels::tile_operands_v<kernels::tile_operand_t<T>>;
  constexpr bool pairs = ops == TileOperands::bf16_pairs;
  switch (choice) {
    case 0: return 0;
    case 1: return backward_working_set_bytes(pairs ? 32 : 3, pairs ? 32 : 5, p.d, p.dv, p.opts.softcap > 0, ops);
    case 2: return backward_working_set_bytes(pairs ? 32 : 16, pairs ? 64 : 32, p.d, p.dv, p.opts.softcap > 0, ops);
    default: return p.budget_bytes;
  }
}

/// The forward on the uncorrupted problem gives O and the LSE (its default budget).
template <class T>
void run_forward(Problem& p, Tensors<T>& t) {
  ForwardOptions f = p.opts;
  f.sram_budget_bytes = 0;
  f.io_counts = nullptr;
  try {
    if (!p.varlen) {
      forward(in_view(t, tq), in_view(t, tk), in_view(t, tv), t[to].view, p.lse_view, f);
    } else {
      const PackedLseView lse{p.lse.data(), {p.hq, p.nq}, {p.lse_view.stride[1], 1}};
      forward_varlen(packed(in_view(t, tq)), packed(in_view(t, tk)), packed(in_view(t, tv)), packed(t[to].view), lse,
                     {p.cu_q, p.cu_k, p.max_q, p.max_k}, f);
    }
  } catch (const tileattn::invalid_argument& err) {
    fail(std::string("the forward rejected a valid problem: ") + err.what() + "\n  " + describe(p, t));
  }
}

template <class T>
void run_backward(const Problem& p, const Tensors<T>& t, const BackwardOptions& opts) {
  if (!p.varlen) {
    backward(in_view(t, tq), in_view(t, tk), in_view(t, tv), in_view(t, to), SavedLseView(p.lse_view), in_view(t, tdo),
             t[tdq].view, t[tdk].view, t[tdv].view, opts);
    return;
  }
  const SavedPackedLseView lse{p.lse_view.data, {p.lse_view.shape[1], p.lse_view.shape[2]},
                               {p.lse_view.stride[1], p.lse_view.stride[2]}};
  const auto cu = [](const std::vector<std::int32_t>& v, const std::int32_t* at) {
    return std::span<const std::int32_t>(at ? at : v.data(), v.size());
  };
  backward_varlen(packed(in_view(t, tq)), packed(in_view(t, tk)), packed(in_view(t, tv)), packed(in_view(t, to)), lse,
                  packed(in_view(t, tdo)), packed(t[tdq].view), packed(t[tdk].view), packed(t[tdv].view),
                  {cu(p.cu_q, p.cu_q_at), cu(p.cu_k, p.cu_k_at), p.max_q, p.max_k}, opts);
}

// ---- The references and the bound ------------------------------------------------------

/// The gradients of the double-precision reference and of the naive same-precision
/// backward, in the reference's contiguous layouts (varlen: batch 1 over the packed rows).
template <class T>
struct References {
  reference::BackwardResult exact;
  reference::NaiveBackwardF naive;
  reference::BackwardResult abs_dout;  // the exact gradients for |dO|: its dV is sum_i P_ij |dO_i|
};

template <class T>
reference::BackwardResult exact(const Problem& p, const std::array<TensorView<const T>, 4>& qkvdo,
                                const reference::Options& ro) {
  const auto& [q, k, v, dout] = qkvdo;
  if (!p.varlen) return reference::attention_backward<T>(q, k, v, dout, ro);
  return reference::attention_backward_varlen<T>(packed(q), packed(k), packed(v), packed(dout), p.cu_q, p.cu_k, ro);
}

/// The references on the stored (rounded) inputs; `abs_dout` is dO's buffer made |dO|.
template <class T>
References<T> references(const Problem& p, const Tensors<T>& t, const Stored<T>& abs_dout) {
  const reference::Options ro = reference::Options::from(p.opts);
  const std::array<TensorView<const T>, 4> in{in_view(t, tq), in_view(t, tk), in_view(t, tv), in_view(t, tdo)};
  References<T> r;
  r.exact = exact<T>(p, in, ro);
  r.naive = p.varlen ? reference::attention_backward_naive_varlen<T>(packed(in[0]), packed(in[1]), packed(in[2]),
                                                                     packed(in[3]), p.cu_q, p.cu_k, ro)
                     : reference::attention_backward_naive<T>(in[0], in[1], in[2], in[3], ro);
  r.abs_dout = exact<T>(p, {in[0], in[1], in[2], TensorView<const T>(abs_dout.view)}, ro);
  return r;
}

/// |x| elementwise, in the same layout (dO's, for the term magnitudes).
Buffer absolute(const Buffer& b) {
  Buffer a = b;
  for (float& x : a.data) x = std::abs(x);
  a.view.data = a.data.data() + (b.view.data - b.data.data());
  return a;
}

/// Largest |x| over a view's finite elements.
template <class T>
double max_finite(const TensorView<const T>& view) {
  double m = 0.0;
  test::for_each_index(view.shape, [&](index_t b, index_t n, index_t h, index_t c) {
    if (const float x = to_float(view(b, n, h, c)); std::isfinite(x)) m = std::max(m, std::abs(static_cast<double>(x)));
  });
  return m;
}

/// The magnitudes F of the terms each gradient element sums before they cancel (file
/// comment), elementwise in the reference's layouts. With |dP_ij| and |D_i| both at most
/// ||dO_i||_1 max|V| (|O_i| <= max|V|: a convex combination) and tanh' <= 1:
///   dQ_ic:  scale sum_j P_ij (|dP_ij| + |D_i|) |K_jc|    <= 2 scale max|V| max|K| ||dO_i||_1
///   dK_jc:  scale sum_i P_ij (|dP_ij| + |D_i|) |Q_ic|    <= 2 scale max|V| max|Q| sum_c' A_jc'
///   dV_jc:  sum_i P_ij |dO_ic|                            = A_jc
///   dsinks: sum_i p_sink_i |D_i|                          <= max|V| sum_i ||dO_i||_1
///   dbias:  sum over broadcast (b, h) of P (|dP| + |D|)   <= 2 max|V| max ||dO_i||_1 x their count
/// where A is the reference's dV for dO = |dO| (sum_i P_ij |dO_ic|, exactly).
struct TermMagnitudes {
  std::vector<double> dq, dk, dv, dsinks, dbias;
};

template <class T>
TermMagnitudes term_magnitudes(const Problem& p, const Tensors<T>& t, const References<T>& r) {
  const double scale = p.opts.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(p.d)));
  const double max_v = max_finite(in_view(t, tv)), max_k = max_finite(in_view(t, tk)),
               max_q = max_finite(in_view(t, tq));
  const TensorView<const T> dout = in_view(t, tdo);
  const reference::BackwardResult& e = r.exact;
  std::vector<double> row_l1(static_cast<std::size_t>(e.batch * e.seqlen_q * e.heads), 0.0);  // ||dO_i||_1
  test::for_each_index(dout.shape, [&](index_t b, index_t i, index_t h, index_t c) {
    row_l1[static_cast<std::size_t>((b * e.seqlen_q + i) * e.heads + h)] += std::abs(to_float(dout(b, i, h, c)));
  });
  TermMagnitudes m;
  m.dq.resize(e.dq.size());
  for (std::size_t x = 0; x < m.dq.size(); ++x)
    m.dq[x] = 2 * scale * max_v * max_k * row_l1[x / static_cast<std::size_t>(e.head_dim)];
  m.dv = r.abs_dout.dv;
  m.dk.resize(e.dk.size());
  for (std::size_t row = 0; row * static_cast<std::size_t>(e.head_dim) < m.dk.size(); ++row) {
    double a = 0.0;
    for (index_t c = 0; c < e.head_dim_v; ++c) a += m.dv[row * static_cast<std::size_t>(e.head_dim_v) + static_cast<std::size_t>(c)];
    for (index_t c = 0; c < e.head_dim; ++c) m.dk[row * static_cast<std::size_t>(e.head_dim) + static_cast<std::size_t>(c)] = 2 * scale * max_v * max_q * a;
  }
  double l1_sum = 0.0, l1_max = 0.0;
  std::vector<double> per_head(static_cast<std::size_t>(e.heads), 0.0);
  for (std::size_t x = 0; x < row_l1.size(); ++x) {
    per_head[x % static_cast<std::size_t>(e.heads)] += row_l1[x];
    l1_sum += row_l1[x];
    l1_max = std::max(l1_max, row_l1[x]);
  }
  for (double s : per_head) m.dsinks.push_back(max_v * s);
  if (!e.dbias.empty()) {
    const double count = static_cast<double>(p.batch / e.bias_shape[0] * (p.hq / e.bias_shape[1]));
    m.dbias.assign(e.dbias.size(), 2 * max_v * l1_max * count);
  }
  (void)l1_sum;
  return m;
}

/// Half the distance between 1 and the next value of T (0 for float: FlashAttention's
/// rule needs no rounding floor there).
template <class T>
double unit_roundoff() {
  return std::is_same_v<T, bf16> ? 0x1p-8 : std::is_same_v<T, fp16> ? 0x1p-11 : 0.0;
}
/// The rounding unit of the cancelling terms' floor: fp32 sums, or O stored in T.
template <class T>
double floor_unit() {
  return std::is_same_v<T, float> ? 0x1p-24 : unit_roundoff<T>();
}
constexpr double floor_factor = 8.0;
constexpr double float_relative = 2e-5, half_relative = 2e-4;

/// One gradient against the reference under the bound (file comment); "" when it holds.
/// `worst` gets the largest error / bound ratio (verbose).
std::string check_gradient(const std::string& name, const std::vector<float>& got, const std::vector<double>& want,
                           const std::vector<float>& naive, const std::vector<double>& terms, double u, double u_floor,
                           double relative, [[maybe_unused]] bool nonfinite_inputs, double& worst) {
  const GradError e = test::grad_error(got, want, name);
  if (!e.problem.empty()) return e.problem;  // the non-finite pattern: NaN reaches what its row sees
  const GradError n = test::grad_error(naive, want, name);
  const double base = 3.0 * std::max(n.max_error, u * e.magnitude) + relative * e.magnitude;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i])) continue;  // got[i] is the same non-finite value (checked above)
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double bound = base + floor_factor * u_floor * terms[i];
    worst = std::max(worst, bound > 0 ? err / bound : (err > 0 ? inf : 0.0));
    if (err > bound)
      return name + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", reference " + std::to_string(want[i]) +
             ": error " + std::to_string(err) + " > bound " + std::to_string(bound) + " (naive " +
             std::to_string(n.max_error) + ", magnitude " + std::to_string(e.magnitude) + ", terms " +
             std::to_string(terms[i]) + ")";
  }
  return "";
}

/// A view's elements as floats, contiguous [B, S, H, D] (the reference's layout); rows from
/// `end` on (a varlen buffer's rows past the last sequence, checked elsewhere) as 0, the
/// reference's value there.
template <class T>
std::vector<float> gather(const TensorView<T>& view, index_t end) {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(view.shape[0] * view.shape[1] * view.shape[2] * view.shape[3]));
  test::for_each_index(view.shape, [&](index_t b, index_t i, index_t h, index_t c) {
    out.push_back(i < end ? to_float(view(b, i, h, c)) : 0.0f);
  });
  return out;
}

std::vector<float> gather_scores(const StridedView<float, 4>& g) {
  std::vector<float> out;
  test::for_each_index(g.shape, [&](index_t b, index_t h, index_t i, index_t j) { out.push_back(g(b, h, i, j)); });
  return out;
}

/// Every gradient against the reference; "" when all hold.
template <class T>
std::string check_gradients(const Problem& p, const Tensors<T>& t, const Stored<T>& abs_dout, bool verbose) {
  const References<T> r = references(p, t, abs_dout);
  const TermMagnitudes m = term_magnitudes(p, t, r);
  const double u = unit_roundoff<T>(), uf = floor_unit<T>();
  const double rel = std::is_same_v<T, float> ? float_relative : half_relative;
  double worst = 0.0;
  const bool nf = !p.poisoned.empty() || std::any_of(p.bias.begin(), p.bias.end(), [](float x) { return std::isnan(x); });
  const index_t q_end = p.varlen ? p.cu_q.back() : p.nq, k_end = p.varlen ? p.cu_k.back() : p.nk;
#ifdef BACKWARD_FUZZ_BREAK  // a deliberately wrong dQ (1% too large), to see the harness fail
  std::vector<float> dq = gather(t[tdq].view, q_end);
  for (float& x : dq) x *= 1.01f;
  std::string problem = check_gradient("dq", dq, r.exact.dq, r.naive.dq, m.dq, u, uf, rel, nf, worst);
#else
  std::string problem = check_gradient("dq", gather(t[tdq].view, q_end), r.exact.dq, r.naive.dq, m.dq, u, uf, rel, nf, worst);
#endif
  if (problem.empty())
    problem = check_gradient("dk", gather(t[tdk].view, k_end), r.exact.dk, r.naive.dk, m.dk, u, uf, rel, nf, worst);
  if (problem.empty())
    problem = check_gradient("dv", gather(t[tdv].view, k_end), r.exact.dv, r.naive.dv, m.dv, u, uf, rel, nf, worst);
  if (problem.empty() && !p.opts.dsinks.empty()) {
    const std::vector<float> got(p.opts.dsinks.begin(), p.opts.dsinks.end());
    problem = check_gradient("dsinks", got, r.exact.dsinks, r.naive.dsinks, m.dsinks, u, uf, rel, nf, worst);
  }
  if (problem.empty() && p.opts.dbias.data)
    problem = check_gradient("dbias", gather_scores(p.opts.dbias), r.exact.dbias, r.naive.dbias, m.dbias, u, uf, rel, nf, worst);
  if (verbose) std::fprintf(stderr, "backward_fuzz: largest error / bound %.3g\n", worst);
  return problem;
}

// ---- The call and the checks ------------------------------------------------------------

/// Copies of everything the call may write, to compare bitwise.
template <class T>
struct Outputs {
  std::vector<T> dq, dk, dv;
  std::vector<float> dsinks, dbias;
  IoCounts counts;
};

template <class T>
Outputs<T> outputs(const Problem& p, const Tensors<T>& t) {
  return {t[tdq].data, t[tdk].data, t[tdv].data, p.dsinks, p.dbias, p.counts};
}

template <class T>
bool same(const Outputs<T>& a, const Outputs<T>& b) {
  return same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) && same_bits(a.dv, b.dv) && same_bits(a.dsinks, b.dsinks) &&
         same_bits(a.dbias, b.dbias);
}

/// Puts every output back to its sentinel (before a rerun).
template <class T>
void reset_outputs(Problem& p, Tensors<T>& t, T grad_sentinel) {
  for (int i : {tdq, tdk, tdv}) std::fill(t[static_cast<std::size_t>(i)].data.begin(), t[static_cast<std::size_t>(i)].data.end(), grad_sentinel);
  std::fill(p.dsinks.begin(), p.dsinks.end(), sentinel);
  std::fill(p.dbias.begin(), p.dbias.end(), sentinel);
}

/// The inputs' buffers (all of them, gaps included), to see that the call wrote none.
template <class T>
std::vector<std::vector<T>> input_buffers(const Tensors<T>& t) {
  return {t[tq].data, t[tk].data, t[tv].data, t[to].data, t[tdo].data};
}

/// Writes outside the gradient views: buffer gaps, dsinks' spare entries, dbias's gaps.
template <class T>
std::string written_outside(const Problem& p, const Tensors<T>& t, T grad_sentinel) {
  for (int i : {tdq, tdk, tdv}) {
    const Stored<T>& s = t[static_cast<std::size_t>(i)];
    if (const std::size_t n = changed_outside(s.view, s.data, grad_sentinel))
      return std::to_string(n) + " elements of " + tensor_names[i] + "'s buffer outside its view were written";
  }
  // A varlen buffer's rows past the last sequence belong to no sequence: untouched, as the
  // forward leaves O's.
  if (p.varlen) {
    for (int i : {tdq, tdk, tdv}) {
      const TensorView<T>& v = t[static_cast<std::size_t>(i)].view;
      const index_t end = i == tdq ? p.cu_q.back() : p.cu_k.back();
      bool written = false;
      test::for_each_index(v.shape, [&](index_t b, index_t n, index_t h, index_t c) {
        written |= n >= end && std::memcmp(&v(b, n, h, c), &grad_sentinel, sizeof(T)) != 0;
      });
      if (written) return std::string("wrote ") + tensor_names[i] + " rows past the last sequence";
    }
  }
  if (!p.dsinks.empty() && (p.dsinks.front() != sentinel || p.dsinks.back() != sentinel))
    return "wrote next to dsinks";
  const auto& g = p.opts.dbias;
  const bool dbias_empty = std::any_of(g.shape.begin(), g.shape.end(), [](index_t x) { return x == 0; });
  if (g.data && !dbias_empty && changed_outside(g, p.dbias, sentinel) != 0) return "wrote into dbias's gaps";
  if (g.data && dbias_empty && !all_bits_equal(p.dbias, sentinel)) return "wrote into an empty dbias's buffer";
  return "";
}

/// Everything after build(): the final views in type T, the forward, the corruption, the
/// backward and the checks.
template <class T>
void execute(Problem& p, int corruption, bool verbose) {
  const T gap = from_float<T>(nan), grad_sentinel = from_float<T>(sentinel);
  Tensors<T> t;
  for (int i = 0; i < tensor_count; ++i)
    t[static_cast<std::size_t>(i)] = make_stored<T>(p.t[static_cast<std::size_t>(i)], p.layout[static_cast<std::size_t>(i)],
                                                    i >= tdq ? grad_sentinel : gap);
  // O's elements start as NaN: the forward writes every one a sequence covers.
  std::fill(t[to].data.begin(), t[to].data.end(), gap);
  run_forward(p, t);
  p.opts.sram_budget_bytes = budget_for<T>(p, p.budget_choice);
  std::vector<float> spare(static_cast<std::size_t>(p.hq), sentinel);  // for corruptions 14, 15
  corrupt(corruption, p, t, spare);
  if (verbose) std::fprintf(stderr, "backward_fuzz: corruption %d: %s\n", corruption, describe(p, t).c_str());
  const auto inputs = input_buffers(t);
  const std::vector<float> lse = p.lse;
  const Outputs<T> before = outputs(p, t);
  const auto inputs_unchanged = [&] {  // bitwise: the gaps hold NaN
    const auto now = input_buffers(t);
    for (std::size_t i = 0; i < now.size(); ++i)
      if (!same_bits(now[i], inputs[i])) return false;
    return test::bitwise_equal(lse, p.lse);
  };
  try {
    run_backward(p, t, p.opts);
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("backward_fuzz", err);
    if (verbose) std::fprintf(stderr, "backward_fuzz: rejected: %s\n", err.what());
    if (!same(outputs(p, t), before) || !all_bits_equal(spare, sentinel) || !(p.counts == IoCounts{7, 7}))
      fail(std::string("wrote outputs before throwing: ") + err.what() + "\n  " + describe(p, t));
    if (!inputs_unchanged()) fail(std::string("wrote an input before throwing: ") + err.what() + "\n  " + describe(p, t));
    return;
  }
  if (verbose) std::fprintf(stderr, "backward_fuzz: ran\n");
  if (p.cu_q_at || p.cu_k_at) fail("accepted cu_seqlens stored in a gradient's memory\n  " + describe(p, t));
  if (!inputs_unchanged()) fail("wrote an input\n  " + describe(p, t));
  if (const std::string w = written_outside(p, t, grad_sentinel); !w.empty()) fail(w + "\n  " + describe(p, t));
  Buffer abs_src = absolute(p.t[tdo]);
  const Stored<T> abs_dout = make_stored<T>(abs_src, p.layout[tdo], gap);
  if (const std::string problem = check_gradients(p, t, abs_dout, verbose); !problem.empty())
    fail("differs from the reference: " + problem + "\n  " + describe(p, t));
  if (!p.rerun) return;
  // Execution promises bitwise-identical gradients for every backend, thread count and budget.
  const Outputs<T> first = outputs(p, t);
  reset_outputs(p, t, grad_sentinel);
  BackwardOptions again = p.opts;
  again.execution = p.again;
  again.sram_budget_bytes = budget_for<T>(p, p.again_budget_choice);
  try {
    run_backward(p, t, again);
  } catch (const tileattn::invalid_argument& err) {  // the other budget may be too small
    fuzz::require_named("backward_fuzz", err);
    return;
  }
  if (!same(outputs(p, t), first)) fail("gradients differ between executions\n  " + describe(p, t));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool verbose = std::getenv("BACKWARD_FUZZ_VERBOSE") != nullptr;
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  Problem p;
  build(in, p, rng);
  const int corruption = choose_corruption(in);
  switch (p.type) {
    case Storage::fp32: execute<float>(p, corruption, verbose); break;
    case Storage::bf16: execute<bf16>(p, corruption, verbose); break;
    case Storage::fp16: execute<fp16>(p, corruption, verbose); break;
  }
  return 0;
}
