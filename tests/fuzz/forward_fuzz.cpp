// tests/fuzz/forward_fuzz.cpp: libFuzzer harness for tileattn::forward and forward_varlen.
//
// The fuzzer's bytes choose everything a caller can: fixed-length or packed varlen batches,
// shapes (head_dim and head_dim_v apart, GQA groups), memory layouts (padded rows, permuted
// [B, H, N, D], stride-0 broadcast K/V), every option (causal and both alignments, windows
// up to INT64_MAX, softcap from subnormal to FLT_MAX, scales, ALiBi, sinks, bias and mask
// with broadcast dimensions), the SRAM budget, backend and thread count, NaN and Inf at
// chosen elements, and then one corruption from a list of bad arguments (or none).
// Each call must either throw tileattn::invalid_argument with O and LSE untouched, or
// match the double-precision reference (NaN rows and all) within the accuracy bound.
// Anything else aborts (a crash, a sanitizer report, another exception, a wrong result).
//
//   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DTILEATTN_BUILD_FUZZERS=ON
//   cmake --build build-fuzz --target forward_fuzz
//   build-fuzz/tests/fuzz/forward_fuzz tests/fuzz/corpus/forward -max_total_time=3600
// (docs/reliability.md has the rest.)
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace tileattn;
using tileattn::test::Deviation;
using tileattn::test::sentinel;

constexpr float nan = std::numeric_limits<float>::quiet_NaN();
constexpr float inf = std::numeric_limits<float>::infinity();

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "forward_fuzz: %s\n", what.c_str());
  std::abort();
}

/// A buffer of N(0, 1) values (seeded from the input) with a view in a chosen layout.
struct Buffer {
  std::vector<float> data;
  TensorView<float> view;
};

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

index_t window_side(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: return -1;
    case 1: return std::numeric_limits<index_t>::max() - in.ConsumeIntegralInRange(0, 2);
    default: return in.ConsumeIntegralInRange<index_t>(0, 48);
  }
}

struct Problem {
  bool varlen = false;
  index_t batch = 1, nq = 1, nk = 1, hq = 1, hkv = 1, d = 1, dv = 1;
  std::vector<std::int32_t> cu_q, cu_k;
  index_t max_q = 0, max_k = 0;
  Buffer q, k, v, o;
  std::vector<float> lse;
  LseView lse_view{};
  ForwardOptions opts;
  std::vector<float> slopes, sinks, bias;
  std::unique_ptr<bool[]> mask;
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
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: o.sram_budget_bytes = 0; break;
    case 1: o.sram_budget_bytes = forward_working_set_bytes(3, 5, p.d, p.dv); break;
    case 2: o.sram_budget_bytes = forward_working_set_bytes(16, 32, p.d, p.dv); break;
    default: o.sram_budget_bytes = in.ConsumeIntegralInRange<std::size_t>(0, 1u << 20); break;
  }
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  Backend backend = backends[in.ConsumeIntegralInRange(0, 3)];
  if (!backend_available(backend)) backend = Backend::serial;
  o.execution = {backend, in.ConsumeIntegralInRange(0, 3)};
}

/// One bad argument (or none): the call must then throw invalid_argument, writing nothing.
void corrupt(FuzzedDataProvider& in, Problem& p) {
  switch (in.ConsumeIntegralInRange(0, 24)) {
    case 0: p.k.view.shape[3] += 1; break;                                  // head_dim mismatch
    case 1: p.o.view.stride[1] = -1; break;                                 // negative stride
    case 2: p.q.view.shape[1] = index_t{1} << 62; break;                     // element count overflow
    case 3: p.k.view.stride[1] = index_t{1} << 61; break;                    // address range overflow
    case 4: p.o.view.data = p.q.view.data; break;                           // O aliases Q
    case 5: p.opts.softmax_scale = -1.0f; break;
    case 6: p.opts.softmax_scale = nan; break;
    case 7: p.opts.window_left = -3; break;
    case 8: p.opts.softcap = inf; break;
    case 9: p.opts.sram_budget_bytes = std::size_t{1} << 40; break;
    case 10: p.opts.execution.num_threads = 100000; break;
    case 11: p.q.view.data = nullptr; break;
    case 12: p.v.view.shape[2] += 1; break;                                 // heads mismatch
    case 13: p.opts.sram_budget_bytes = 64; break;                          // below 1 x 1 tiles
    case 14:
      if (p.varlen && p.cu_q.size() > 2) std::swap(p.cu_q[1], p.cu_q[2]);   // maybe decreasing
      break;
    case 15:
      if (p.varlen) p.cu_k.back() += 5;                                     // past the buffer
      break;
    case 16: p.sinks.assign(1, 0.0f), p.opts.sinks = p.sinks; break;        // wrong count (unless hq == 1)
    default: break;  // no corruption
  }
}

/// What the failing input asked for, printed with a failure.
std::string describe(const Problem& p) {
  const ForwardOptions& o = p.opts;
  std::string s = (p.varlen ? "varlen" : "fixed") + std::string(" B ") + std::to_string(p.batch) + " Nq " +
                   std::to_string(p.nq) + " Nk " + std::to_string(p.nk) + " H " + std::to_string(p.hq) + "/" +
                   std::to_string(p.hkv) + " d " + std::to_string(p.d) + " dv " + std::to_string(p.dv) +
                   " causal " + std::to_string(o.causal) + " top_left " +
                   std::to_string(o.alignment == MaskAlignment::top_left) + " window " +
                   std::to_string(o.window_left) + "," + std::to_string(o.window_right) + " softcap " +
                   std::to_string(o.softcap) + " scale " + (o.softmax_scale ? std::to_string(*o.softmax_scale) : "default") +
                   " alibi " + std::to_string(p.slopes.size()) + " sinks " + std::to_string(p.sinks.size()) +
                   " bias " + std::to_string(p.bias.size()) + " mask " + std::to_string(p.mask != nullptr) +
                   " budget " + std::to_string(o.sram_budget_bytes) + " backend " + to_string(o.execution.backend) +
                   " x " + std::to_string(o.execution.num_threads) + " strides k";
  for (index_t x : p.k.view.stride) s += " " + std::to_string(x);
  s += " v";
  for (index_t x : p.v.view.stride) s += " " + std::to_string(x);
  return s;
}

Deviation check_against_reference(Problem& p) {
  const reference::Options ro = reference::Options::from(p.opts);
  if (!p.varlen) {
    const auto ref = reference::attention<float>(p.q.view, p.k.view, p.v.view, ro);
    return test::compare_to_reference(ref, p.o.view, p.lse_view);
  }
  Deviation all;
  for (std::size_t b = 0; b + 1 < p.cu_q.size(); ++b) {
    reference::Options rb = ro;
    rb.batch_index = static_cast<index_t>(b);
    const auto seq = [&](const Buffer& t, index_t start, index_t len) {
      return reference::sequence_view<float>(
          StridedView<const float, 3>{t.view.data, {t.view.shape[1], t.view.shape[2], t.view.shape[3]},
                                      {t.view.stride[1], t.view.stride[2], t.view.stride[3]}},
          start, len);
    };
    const index_t lq = p.cu_q[b + 1] - p.cu_q[b], lk = p.cu_k[b + 1] - p.cu_k[b];
    const auto ref = reference::attention<float>(seq(p.q, p.cu_q[b], lq), seq(p.k, p.cu_k[b], lk),
                                                 seq(p.v, p.cu_k[b], lk), rb);
    const LseView lse = p.lse_view.data ? LseView{p.lse_view.data + p.cu_q[b], {1, p.hq, lq}, {0, p.nq, 1}} : LseView{};
    const Deviation d = test::compare_to_reference(ref, seq(p.o, p.cu_q[b], lq), lse);
    all.o = std::max(all.o, d.o);
    all.lse = std::max(all.lse, d.lse);
    if (all.problem.empty()) all.problem = d.problem;
  }
  return all;
}

void run(Problem& p) {
  if (!p.varlen) {
    forward(p.q.view, p.k.view, p.v.view, p.o.view, p.lse_view, p.opts);
    return;
  }
  const auto packed = [](const TensorView<float>& t) {
    return StridedView<float, 3>{t.data, {t.shape[1], t.shape[2], t.shape[3]}, {t.stride[1], t.stride[2], t.stride[3]}};
  };
  const PackedLseView lse = p.lse_view.data ? make_packed_lse(p.lse.data(), p.hq, p.nq) : PackedLseView{};
  forward_varlen(packed(p.q.view), packed(p.k.view), packed(p.v.view), packed(p.o.view), lse,
                 {p.cu_q, p.cu_k, p.max_q, p.max_k}, p.opts);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  Problem p;
  build(in, p, rng);
  corrupt(in, p);
  try {
    run(p);
  } catch (const tileattn::invalid_argument& e) {
    if (e.parameter().empty() || std::string(e.what()).find(e.parameter()) == std::string::npos)
      fail(std::string("an error that does not name its parameter: ") + e.what());
    if (!test::all_equal(p.o.data, sentinel) || !test::all_equal(p.lse, sentinel))
      fail(std::string("wrote outputs before throwing: ") + e.what());
    return 0;
  }
  // Accepted: the result must be the reference's (bounds for N(0, 1) inputs at scales up
  // to 1 and d up to 72: 1e-4 absolute on O, on the LSE relative to its size).
  const Deviation dev = check_against_reference(p);
  if (!dev.problem.empty()) fail("differs from the reference: " + dev.problem + "\n  " + describe(p));
  if (dev.o > 1e-4 || dev.lse > 1e-4)
    fail("error " + std::to_string(dev.o) + " on O, " + std::to_string(dev.lse) + " on LSE\n  " + describe(p));
  return 0;
}
