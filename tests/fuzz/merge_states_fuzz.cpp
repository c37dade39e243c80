// tests/fuzz/merge_states_fuzz.cpp: libFuzzer harness for tileattn::merge_states (paged.hpp),
// the merge of partial attention states (O_c, LSE_c) over disjoint key sets.
//
// The fuzzer's bytes choose the storage type of the states and the output (float, bf16,
// fp16), the shape (batch 1-2, seqlen 1-20, heads 1-4, head_dim_v 1-40), the number of
// states (1-5, through the span form or the two-state form), each state's layout (bshd,
// bhsd, padded window, head_dim strided) and its LSE's layout ([B, H, S], padded, or
// [B, S, H] order), the LSE values row by row (N(0, 1) times 1, 30 or 1e4; -inf, a state
// that saw no key; NaN; +inf; magnitudes up to FLT_MAX), NaN at chosen O elements, where
// the result goes (a fresh O, or in place into one of the states; the LSE fresh, into one
// of the LSE states, or not written), the backend and thread count, a rerun on another
// execution that must give the same bits, and one bad argument from a list (or none).
//
// Each call must either throw tileattn::invalid_argument naming its parameter with every
// buffer (states, LSE states, O and LSE) bitwise as it was, or match the definition in
// double precision: per row, LSE = log(sum_c e^LSE_c) and O = sum_c e^(LSE_c - LSE) O_c
// over the states whose LSE is not -inf; no such state: O = 0, LSE = -inf; a NaN LSE, an
// LSE of +inf or one above max_natural_log_magnitude (the kernel works in log2 units, where
// it is +inf): the row is NaN; one below -max_natural_log_magnitude counts as -inf. A NaN
// element of an O_c that counts makes that element NaN.
// Bounds (N(0, 1) O values, so max|O_c| <= ~5): the kernel takes LSE_c * log2(e) in float,
// an absolute error of 2^-24 |LSE_c| in log2 units, so each weight is off by a relative
// 2^-23 max|LSE| (plus a few ulps of the exp2 and the sums): O within
// (4e-6 C + 2^-21 max|LSE|) max|O_c|, plus the type's rounding of O (bf16 2^-8, fp16 2^-11,
// of max|O_c|); the LSE within 1e-6 (1 + C) + 2^-21 |LSE|.
//
//   build-fuzz/tests/fuzz/merge_states_fuzz tests/fuzz/corpus/merge_states -max_total_time=3600
// MERGE_STATES_FUZZ_VERBOSE=1 prints what each input decodes to (docs/reliability.md).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "support/test_support.hpp"
#include "tileattn/paged.hpp"

namespace {

using namespace tileattn;
using fuzz::inf;
using fuzz::nan;

[[noreturn]] void fail(const std::string& what) { fuzz::fail("merge_states_fuzz", what); }

/// A [batch, seqlen, heads, dv] tensor of T in one of test::Layout's layouts.
template <class T>
struct State {
  std::vector<T> data;
  TensorView<T> view;
};

template <class T>
State<T> make_state(test::Dims dims, test::Layout layout, float fill) {
  std::size_t size = 0;
  test::layout_view(nullptr, dims, layout, &size);
  std::vector<float> offsets(size);  // a float twin gives the view's offset and strides
  const TensorView<float> f = test::layout_view(offsets.data(), dims, layout, nullptr);
  State<T> s;
  s.data.assign(size, from_float<T>(fill));
  s.view = {s.data.data() + (f.data - offsets.data()), f.shape, f.stride};
  return s;
}

/// An LSE [batch, heads, seqlen] in one of three layouts: contiguous, padded, [B, S, H] order.
struct Lse {
  std::vector<float> data;
  StridedView<float, 3> view;
};

Lse make_lse_buffer(index_t b, index_t h, index_t s, int layout, float fill) {
  Lse l;
  switch (layout) {
    case 0:
      l.data.assign(static_cast<std::size_t>(b * h * s), fill);
      l.view = make_lse(l.data.data(), b, h, s);
      break;
    case 1:  // two spare entries after each head's row, three before the first
      l.data.assign(static_cast<std::size_t>(b * h * (s + 2) + 3), fill);
      l.view = {l.data.data() + 3, {b, h, s}, {h * (s + 2), s + 2, 1}};
      break;
    default:
      l.data.assign(static_cast<std::size_t>(b * h * s), fill);
      l.view = {l.data.data(), {b, h, s}, {h * s, 1, h}};
      break;
  }
  return l;
}

/// One LSE value: mostly finite at a chosen spread; -inf often (a state that saw no key).
float lse_value(FuzzedDataProvider& in, std::mt19937& rng, float spread) {
  std::normal_distribution<float> normal;
  switch (in.ConsumeIntegralInRange(0, 15)) {
    case 0: case 1: case 2: return -inf;
    case 3: return in.ConsumeIntegralInRange(0, 3) == 0 ? nan : normal(rng) * spread;
    case 4: return in.ConsumeIntegralInRange(0, 3) == 0 ? inf : normal(rng) * spread;
    case 5: return (in.ConsumeBool() ? 1.0f : -1.0f) * in.ConsumeFloatingPointInRange(1e30f, 3.4e38f);
    default: return normal(rng) * spread;
  }
}

struct Problem {
  test::Dims dims{1, 1, 1, 1};
  int count = 1;
  bool two_state_form = false;
  int out_layout = 0, lse_out_layout = 0;
  int o_in_place = -1;    // >= 0: O is that state exactly
  int lse_mode = 0;       // 0: not written, 1: fresh, 2: into lse_states[lse_target]
  int lse_target = 0;
  Execution execution, again;
  bool rerun = false;
};

template <class T>
struct Buffers {
  std::vector<State<T>> states;
  std::vector<Lse> lses;
  State<T> o;
  Lse lse;
};

Problem build(FuzzedDataProvider& in) {
  Problem p;
  p.dims = {in.ConsumeIntegralInRange<index_t>(1, 2), in.ConsumeIntegralInRange<index_t>(1, 20),
            in.ConsumeIntegralInRange<index_t>(1, 4), in.ConsumeIntegralInRange<index_t>(1, 40)};
  p.count = in.ConsumeIntegralInRange(1, 5);
  p.two_state_form = p.count == 2 && in.ConsumeBool();
  p.out_layout = in.ConsumeIntegralInRange(0, 3);
  p.lse_out_layout = in.ConsumeIntegralInRange(0, 2);
  p.o_in_place = in.ConsumeIntegralInRange(0, 3) == 0 ? in.ConsumeIntegralInRange(0, p.count - 1) : -1;
  p.lse_mode = in.ConsumeIntegralInRange(0, 2);
  p.lse_target = in.ConsumeIntegralInRange(0, p.count - 1);
  const Backend backends[] = {Backend::automatic, Backend::serial, Backend::openmp, Backend::tbb};
  const auto pick = [&](Backend b) { return backend_available(b) ? b : Backend::serial; };
  p.execution = {pick(backends[in.ConsumeIntegralInRange(0, 3)]), in.ConsumeIntegralInRange(0, 3)};
  p.again = {pick(backends[in.ConsumeIntegralInRange(0, 3)]), in.ConsumeIntegralInRange(0, 3)};
  p.rerun = in.ConsumeBool();
  return p;
}

template <class T>
Buffers<T> fill(FuzzedDataProvider& in, const Problem& p, std::mt19937& rng) {
  Buffers<T> t;
  const auto [B, S, H, D] = p.dims;
  const float spreads[] = {1.0f, 30.0f, 1e4f};
  std::normal_distribution<float> normal;
  for (int c = 0; c < p.count; ++c) {
    State<T> s = make_state<T>(p.dims, static_cast<test::Layout>(in.ConsumeIntegralInRange(0, 3)), nan);
    test::for_each_index(s.view.shape, [&](index_t b, index_t n, index_t h, index_t d) {
      s.view(b, n, h, d) = from_float<T>(normal(rng));
    });
    if (in.ConsumeIntegralInRange(0, 7) == 0) {  // NaN at one chosen element
      const index_t e = in.ConsumeIntegralInRange<index_t>(0, B * S * H * D - 1);
      s.view(e / (S * H * D), e / (H * D) % S, e / D % H, e % D) = from_float<T>(nan);
    }
    t.states.push_back(std::move(s));
    Lse l = make_lse_buffer(B, H, S, in.ConsumeIntegralInRange(0, 2), nan);
    const float spread = spreads[in.ConsumeIntegralInRange(0, 2)];
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t n = 0; n < S; ++n) l.view(b, h, n) = lse_value(in, rng, spread);
    t.lses.push_back(std::move(l));
  }
  t.o = make_state<T>(p.dims, static_cast<test::Layout>(p.out_layout), test::sentinel);
  t.lse = make_lse_buffer(B, H, S, p.lse_out_layout, test::sentinel);
  return t;
}

/// The views a call gets (before any corruption).
template <class T>
struct Call {
  std::vector<TensorView<const T>> states;
  std::vector<StridedView<const float, 3>> lses;
  TensorView<T> o;
  LseView lse;
  Execution execution;
};

template <class T>
Call<T> views(const Problem& p, Buffers<T>& t) {
  Call<T> c;
  for (const auto& s : t.states) c.states.push_back(s.view);
  for (const auto& l : t.lses) c.lses.push_back(l.view);
  c.o = p.o_in_place >= 0 ? t.states[static_cast<std::size_t>(p.o_in_place)].view : t.o.view;
  if (p.lse_mode == 1) c.lse = t.lse.view;
  if (p.lse_mode == 2) c.lse = t.lses[static_cast<std::size_t>(p.lse_target)].view;
  c.execution = p.execution;
  return c;
}

/// One bad argument (or none): the call must then throw invalid_argument, changing nothing.
template <class T>
void corrupt(int choice, Call<T>& c, Buffers<T>& t) {
  switch (choice) {
    case 0: c.states.clear(), c.lses.clear(); break;                 // no state
    case 1: c.lses.pop_back(); break;                               // an LSE short
    case 2: c.o.shape[3] += 1; break;                               // head_dim_v mismatch
    case 3: c.lses.back().shape[1] += 1; break;                     // LSE heads mismatch
    case 4: c.o = t.states.front().view, c.o.stride[0] += 1; break;  // O over a state, not it
    case 5: c.o.stride[1] = -1; break;                              // negative stride
    case 6: c.o.data = nullptr; break;
    case 7: c.execution.num_threads = 100000; break;
    case 8: c.states.back().data = nullptr; break;
    case 9:  // an LSE of the wrong shape
      if (!c.lse.data) c.lse = t.lse.view;
      c.lse.shape[2] += 1;
      break;
    case 10: c.o.stride[1] = 0, c.o.shape[1] = std::max<index_t>(c.o.shape[1], 2); break;  // O over itself
    case 11: c.states.front().shape[0] += 1; break;                 // batch mismatch
    case 12: c.o.shape[3] = 0, c.states.front().shape[3] = 0; break;  // head_dim_v 0
    default: break;
  }
}

template <class T>
void run(const Problem& p, const Call<T>& c) {
  if (p.two_state_form && c.states.size() == 2 && c.lses.size() == 2) {
    merge_states<T>(c.states[0], c.lses[0], c.states[1], c.lses[1], c.o, c.lse, c.execution);
    return;
  }
  merge_states<T>(std::span<const TensorView<const T>>(c.states), c.lses, c.o, c.lse, c.execution);
}

/// Every buffer's bits, to see what a call changed.
template <class T>
struct Snapshot {
  std::vector<std::vector<T>> states;
  std::vector<std::vector<float>> lses;
  std::vector<T> o;
  std::vector<float> lse;
};

template <class T>
Snapshot<T> snapshot(const Buffers<T>& t) {
  Snapshot<T> s{{}, {}, t.o.data, t.lse.data};
  for (const auto& x : t.states) s.states.push_back(x.data);
  for (const auto& x : t.lses) s.lses.push_back(x.data);
  return s;
}

template <class T>
bool unchanged(const Snapshot<T>& a, const Buffers<T>& t) {
  bool same = fuzz::same_bits(a.o, t.o.data) && fuzz::same_bits(a.lse, t.lse.data);
  for (std::size_t c = 0; c < a.states.size(); ++c)
    same = same && fuzz::same_bits(a.states[c], t.states[c].data) && fuzz::same_bits(a.lses[c], t.lses[c].data);
  return same;
}

std::string describe(const Problem& p, int corruption, const char* type) {
  const auto [B, S, H, D] = p.dims;
  return std::string(type) + " B " + std::to_string(B) + " S " + std::to_string(S) + " H " + std::to_string(H) +
         " dv " + std::to_string(D) + " states " + std::to_string(p.count) + (p.two_state_form ? " (two-state form)" : "") +
         " o " + (p.o_in_place >= 0 ? "in state " + std::to_string(p.o_in_place) : "layout " + std::to_string(p.out_layout)) +
         " lse " + (p.lse_mode == 0 ? "none" : p.lse_mode == 1 ? "fresh" : "in lse_states " + std::to_string(p.lse_target)) +
         " on " + to_string(p.execution.backend) + " x " + std::to_string(p.execution.num_threads) +
         (p.rerun ? std::string(" rerun on ") + to_string(p.again.backend) + " x " + std::to_string(p.again.num_threads) : "") +
         " corruption " + std::to_string(corruption);
}

/// The definition in double for one row (b, n, h), from the inputs as they were.
struct RowResult {
  std::vector<double> o;
  double lse = 0.0;
  bool nan_row = false;
};

template <class T>
RowResult reference_row(const Snapshot<T>& in, const Buffers<T>& t, index_t b, index_t n, index_t h, index_t dv) {
  RowResult r;
  r.o.assign(static_cast<std::size_t>(dv), 0.0);
  double m = -HUGE_VAL;
  std::vector<double> l(in.states.size());
  for (std::size_t c = 0; c < l.size(); ++c) {
    const auto off = &t.lses[c].view(b, h, n) - t.lses[c].data.data();
    l[c] = in.lses[c][static_cast<std::size_t>(off)];
    if (l[c] < -max_natural_log_magnitude) l[c] = -HUGE_VAL;  // -inf in log2 units: no key
    if (std::isnan(l[c]) || l[c] > max_natural_log_magnitude) r.nan_row = true;
    m = std::max(m, l[c]);
  }
  if (r.nan_row || m == -HUGE_VAL) {
    r.lse = r.nan_row ? NAN : -HUGE_VAL;
    return r;
  }
  double sum = 0.0;
  for (double x : l) sum += std::exp(x - m);
  r.lse = m + std::log(sum);
  for (std::size_t c = 0; c < l.size(); ++c) {
    if (l[c] == -HUGE_VAL) continue;
    const double w = std::exp(l[c] - r.lse);
    const auto& v = t.states[c].view;
    for (index_t d = 0; d < dv; ++d) {
      const auto off = &v(b, n, h, d) - t.states[c].data.data();
      r.o[static_cast<std::size_t>(d)] += w * static_cast<double>(to_float(in.states[c][static_cast<std::size_t>(off)]));
    }
  }
  return r;
}

template <class T>
double type_rounding() {
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-8;
  else if constexpr (std::is_same_v<T, fp16>) return 0x1p-11;
  else return 0.0;
}

/// Compares every row of the result (c.o, c.lse) with the definition; returns a problem or "".
template <class T>
std::string check(const Snapshot<T>& in, const Buffers<T>& t, const Call<T>& c) {
  const auto [B, S, H, D] = t.states.front().view.shape;
  double max_o = 0.0, max_lse = 0.0;
  for (std::size_t s = 0; s < in.states.size(); ++s) {
    for (const T& x : in.states[s]) if (std::isfinite(to_float(x))) max_o = std::max(max_o, std::abs(double(to_float(x))));
    for (float x : in.lses[s]) if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(double(x)));
  }
  const double count = static_cast<double>(in.states.size());
  const double o_tol = (4e-6 * count + 0x1p-21 * max_lse + type_rounding<T>()) * max_o + 1e-30;
  for (index_t b = 0; b < B; ++b)
    for (index_t n = 0; n < S; ++n)
      for (index_t h = 0; h < H; ++h) {
        const RowResult r = reference_row(in, t, b, n, h, D);
        const std::string at = " at (" + std::to_string(b) + ", " + std::to_string(n) + ", " + std::to_string(h) + ")";
        for (index_t d = 0; d < D; ++d) {
          const double got = to_float(c.o(b, n, h, d)), want = r.o[static_cast<std::size_t>(d)];
          if (r.nan_row || std::isnan(want)) {
            if (!std::isnan(got)) return "O" + at + " is " + std::to_string(got) + ", want NaN";
          } else if (!(std::abs(got - want) <= o_tol)) {
            return "O" + at + " element " + std::to_string(d) + " is " + std::to_string(got) + ", want " +
                   std::to_string(want) + " (tolerance " + std::to_string(o_tol) + ")";
          }
        }
        if (!c.lse.data) continue;
        const double got = c.lse(b, h, n);
        const bool ok = r.nan_row ? std::isnan(got)
                        : r.lse == -HUGE_VAL ? got == -HUGE_VAL
                        : std::abs(got - r.lse) <= 1e-6 * (1.0 + count) + 0x1p-21 * std::abs(r.lse);
        if (!ok) return "LSE" + at + " is " + std::to_string(got) + ", want " + std::to_string(r.lse);
      }
  return "";
}

template <class T>
void execute(FuzzedDataProvider& in, const Problem& p, std::mt19937& rng, bool verbose) {
  Buffers<T> t = fill<T>(in, p, rng);
  const int corruption = in.ConsumeIntegralInRange(0, 20);
  Call<T> c = views(p, t);
  corrupt(corruption, c, t);
  const std::string what = describe(p, corruption, type_name<T>());
  if (verbose) std::fprintf(stderr, "merge_states_fuzz: %s\n", what.c_str());
  const Snapshot<T> before = snapshot(t);
  try {
    run(p, c);
  } catch (const tileattn::invalid_argument& err) {
    fuzz::require_named("merge_states_fuzz", err);
    if (!unchanged(before, t)) fail(std::string("changed a buffer before throwing: ") + err.what() + "\n  " + what);
    return;
  }
  if (corruption <= 12) fail("accepted a bad argument\n  " + what);
  if (const std::string problem = check(before, t, c); !problem.empty()) fail(problem + "\n  " + what);
  if (p.o_in_place < 0 && fuzz::changed_outside(t.o.view, t.o.data, from_float<T>(test::sentinel)))
    fail("wrote O's buffer outside its view\n  " + what);
  if (p.lse_mode != 1 && !fuzz::same_bits(before.lse, t.lse.data)) fail("wrote an LSE it was not given\n  " + what);
  if (!p.rerun) return;
  // Same inputs, another execution: the same bits (O in place: the inputs are gone).
  if (p.o_in_place >= 0 || p.lse_mode == 2) return;
  const Snapshot<T> first = snapshot(t);
  c.execution = p.again;
  run(p, c);
  if (!unchanged(first, t)) fail("results differ between executions\n  " + what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool verbose = std::getenv("MERGE_STATES_FUZZ_VERBOSE") != nullptr;
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  const int type = in.ConsumeIntegralInRange(0, 2);
  const Problem p = build(in);
  switch (type) {
    case 0: execute<float>(in, p, rng, verbose); break;
    case 1: execute<bf16>(in, p, rng, verbose); break;
    default: execute<fp16>(in, p, rng, verbose); break;
  }
  return 0;
}
