// tests/support/test_support.hpp: shared test helpers: seeded random tensors in several memory
// layouts, output sentinels, the forward error bounds and metrics against the double
// reference, a naive fp32 attention, and the list of compiled-in backends.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {

// ---- Error bounds --------------------------------------------------------------------------

/// Forward accuracy bounds: fp32 kernel against the double reference, inputs drawn from
/// N(0, 1) and the default softmax scale 1/sqrt(d) (so scores are about N(0, 1)); max
/// absolute error over every element of O and every finite LSE. This is the constant term
/// of FlashAttention's rule "kernel error <= 2e-5 + 2 x the error of a naive fp32
/// implementation": a naive fp32 attention errs by 3e-7 to 2e-6 on these shapes, the kernel
/// by at most 1.5e-6 (measured over the whole suite), so the bound has a 10x margin and still
/// catches algorithmic bugs: a missing rescale of the output accumulator errs by more than
/// 1e-2 (ops/online_softmax_test.cpp, MissingRescaleIsCaught). Larger softmax scales make
/// the softmax peaked and the fp32 error grow with it; tests with a custom scale apply
/// FlashAttention's rule with the naive fp32 error measured on the same inputs.
inline constexpr double forward_o_tolerance = 2e-5;
inline constexpr double forward_lse_tolerance = 2e-5;

/// The head dims the suites sweep: the common ones, then odd ones (any head_dim in
/// [1, max_head_dim] takes the same path: none is special).
inline constexpr std::array<index_t, 12> test_head_dims{32, 64, 80, 96, 128, 256, 1, 40, 59, 72, 111, 192};

/// The SRAM budget that holds exactly `rows` packed query rows beside the fixed key tiles of
/// head dims d / dv (forward_key_tile: the budget never changes Bc): what tests pass to force
/// many query tiles. operands: the tile layout (fp32; for bf16 the running micro-kernel set's,
/// kernels::tile_operands_for<bf16, bf16>(): pairs, or panels where the set has them).
inline std::size_t rows_budget(index_t rows, index_t d, index_t dv = 0, TileOperands operands = TileOperands::fp32) {
  const index_t v = dv > 0 ? dv : d;
  const PlanShape shape{d, v, rows, index_t{1} << 20, 1, 1, operands};
  return forward_working_set_bytes(rows, forward_key_tile(shape), d, v, operands);
}

/// A budget that holds `rows` rows beside the key tiles of every operand layout this machine
/// runs (fp32, bf16 pairs, and its bf16 one: panels where the set has them): for callers that
/// draw one budget for any storage type (the fuzz harnesses).
inline std::size_t rows_budget_any(index_t rows, index_t d, index_t dv = 0) {
  return std::max({rows_budget(rows, d, dv), rows_budget(rows, d, dv, TileOperands::bf16_pairs),
                   rows_budget(rows, d, dv, kernels::tile_operands_for<bf16, bf16>())});
}

/// rows_budget for the tiles the kernels hold for element types T and KV.
template <class T, class KV = T>
std::size_t rows_budget_for(index_t rows, index_t d, index_t dv = 0) {
  return rows_budget(rows, d, dv, kernels::tile_operands_for<T, KV>());
}

/// Written into every output element before a call, to see what a call wrote.
inline constexpr float sentinel = 1234.5f;

// ---- Layouts and host tensors --------------------------------------------------------------

/// How a logical [batch, seqlen, heads, head_dim] tensor sits in its buffer.
enum class Layout {
  bshd,       // contiguous [B, S, H, D] (make_bshd)
  bhsd,       // contiguous [B, H, S, D] (make_bhsd)
  window,     // rows [5, 5 + S) of a longer, padded [B, S + 9, H, D + 3] buffer (a KV-cache window)
  dim_major,  // [B, H, D, S]: head_dim is the strided dimension (col_stride = S)
};

inline constexpr Layout all_layouts[] = {Layout::bshd, Layout::bhsd, Layout::window,
                                         Layout::dim_major};

inline const char* to_string(Layout l) {
  switch (l) {
    case Layout::bshd: return "bshd";
    case Layout::bhsd: return "bhsd";
    case Layout::window: return "window";
    case Layout::dim_major: return "dimmajor";
  }
  return "unknown";
}

struct Dims {
  index_t batch, seqlen, heads, head_dim;
};

/// Builds the view of `layout` over `data` (nullptr: only the buffer size is computed).
inline TensorView<float> layout_view(float* data, Dims s, Layout layout, std::size_t* buffer_size) {
  constexpr index_t window_offset = 5, window_extra_rows = 9, window_pad = 3;
  const index_t B = s.batch, S = s.seqlen, H = s.heads, D = s.head_dim;
  TensorView<float> v;
  std::size_t size = static_cast<std::size_t>(B * S * H * D);
  switch (layout) {
    case Layout::bshd: v = make_bshd(data, B, S, H, D); break;
    case Layout::bhsd: v = make_bhsd(data, B, H, S, D); break;
    case Layout::window: {
      const index_t rows = S + window_extra_rows, dp = D + window_pad;
      size = static_cast<std::size_t>(B * rows * H * dp);
      v = {data ? data + window_offset * H * dp : nullptr,
           {B, S, H, D},
           {rows * H * dp, H * dp, dp, 1}};
      break;
    }
    case Layout::dim_major: v = {data, {B, S, H, D}, {H * D * S, 1, D * S, S}}; break;
  }
  if (buffer_size) *buffer_size = size;
  return v;
}

/// Calls f(b, s, h, d) for every index of a 4-D shape.
template <class F>
void for_each_index(const std::array<index_t, 4>& shape, F&& f) {
  for (index_t b = 0; b < shape[0]; ++b)
    for (index_t s = 0; s < shape[1]; ++s)
      for (index_t h = 0; h < shape[2]; ++h)
        for (index_t d = 0; d < shape[3]; ++d) f(b, s, h, d);
}

/// Element offsets (from the buffer start) a view covers, as a mask over the buffer.
template <class T, int R>
std::vector<bool> covered_mask(const StridedView<T, R>& v, const T* buffer_begin, std::size_t size) {
  std::vector<bool> covered(size, false);
  std::array<index_t, R> idx{};
  const index_t base = v.data - buffer_begin;
  while (true) {
    index_t off = base;
    for (int d = 0; d < R; ++d) off += idx[d] * v.stride[d];
    covered[static_cast<std::size_t>(off)] = true;
    int d = R - 1;
    while (d >= 0 && ++idx[d] == v.shape[d]) idx[d--] = 0;
    if (d < 0) break;
  }
  return covered;
}

/// Elements of `buffer` outside `view` that no longer hold `value` (bitwise).
template <int R>
std::size_t changed_outside(const StridedView<float, R>& view, const std::vector<float>& buffer,
                            float value) {
  const auto covered = covered_mask(view, buffer.data(), buffer.size());
  std::size_t changed = 0;
  for (std::size_t i = 0; i < buffer.size(); ++i)
    if (!covered[i] && std::memcmp(&buffer[i], &value, sizeof(float)) != 0) ++changed;
  return changed;
}

/// An owning buffer and a [batch, seqlen, heads, head_dim] view of it in some layout.
/// Move-only: the view points into the buffer, which a move keeps in place.
class HostTensor {
 public:
  HostTensor(Dims dims, Layout layout) : layout_(layout) {
    std::size_t size = 0;
    layout_view(nullptr, dims, layout, &size);
    buffer_.assign(size, 0.0f);
    view_ = layout_view(buffer_.data(), dims, layout, nullptr);
  }
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;

  TensorView<float> view() const { return view_; }
  TensorView<const float> cview() const { return view_; }
  Layout layout() const { return layout_; }
  std::vector<float>& buffer() { return buffer_; }
  const std::vector<float>& buffer() const { return buffer_; }

  /// Every buffer element (padding included) drawn from N(0, 1) with this seed.
  void fill_normal(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : buffer_) x = normal(rng);
  }
  void fill(float value) { std::fill(buffer_.begin(), buffer_.end(), value); }

  /// Buffer elements outside the view that no longer hold `value`.
  std::size_t changed_outside_view(float value) const {
    return changed_outside(view_, buffer_, value);
  }

 private:
  Layout layout_;
  std::vector<float> buffer_;
  TensorView<float> view_;
};

/// An owning log-sum-exp buffer [batch, heads, seqlen_q], contiguous or strided (every
/// other element of a longer row, so writes outside the view show up).
class HostLse {
 public:
  HostLse(index_t batch, index_t heads, index_t seqlen_q, bool strided = false) {
    if (!strided) {
      buffer_.assign(static_cast<std::size_t>(batch * heads * seqlen_q), 0.0f);
      view_ = make_lse(buffer_.data(), batch, heads, seqlen_q);
    } else {
      const index_t row = 2 * seqlen_q + 1;
      buffer_.assign(static_cast<std::size_t>(batch * heads * row), 0.0f);
      view_ = {buffer_.data(), {batch, heads, seqlen_q}, {heads * row, row, 2}};
    }
  }
  HostLse(HostLse&&) = default;
  HostLse& operator=(HostLse&&) = default;
  HostLse(const HostLse&) = delete;
  HostLse& operator=(const HostLse&) = delete;

  LseView view() const { return view_; }
  std::vector<float>& buffer() { return buffer_; }
  const std::vector<float>& buffer() const { return buffer_; }
  void fill(float value) { std::fill(buffer_.begin(), buffer_.end(), value); }

  std::size_t changed_outside_view(float value) const {
    return changed_outside(view_, buffer_, value);
  }

 private:
  std::vector<float> buffer_;
  LseView view_;
};

/// Whether every byte of `buffer` still holds `value` (a call wrote nothing).
inline bool all_equal(const std::vector<float>& buffer, float value) {
  return std::all_of(buffer.begin(), buffer.end(), [&](const float& x) {
    return std::memcmp(&x, &value, sizeof(float)) == 0;
  });
}

/// How many times the parallel backends repeat each determinism check:
/// TILEATTN_DETERMINISM_REPEATS, 50 by default (FlashAttention reruns its race test 250 times).
inline int determinism_repeats() {
  const char* env = std::getenv("TILEATTN_DETERMINISM_REPEATS");
  return env ? std::max(1, std::atoi(env)) : 50;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- Errors against the reference ----------------------------------------------------------

/// Max absolute errors of a forward result, and the first structural problem found
/// (a NaN where the reference has none or none where it has one, an unmasked row that is
/// not finite, a row with no visible key whose O is not exactly 0 or whose LSE is not
/// -inf). `problem` is empty when there is none.
struct Deviation {
  double o = 0.0;
  double lse = 0.0;
  std::string problem;
};

inline Deviation compare_to_reference(const reference::AttentionResult& ref,
                                      const TensorView<const float>& o, const LseView& lse) {
  Deviation dev;
  const auto note = [&](const std::string& what, index_t b, index_t i, index_t h) {
    if (dev.problem.empty())
      dev.problem = what + " at batch " + std::to_string(b) + ", query " + std::to_string(i) +
                    ", head " + std::to_string(h);
  };
  for (index_t b = 0; b < ref.batch; ++b)
    for (index_t h = 0; h < ref.heads; ++h)
      for (index_t i = 0; i < ref.seqlen_q; ++i) {
        const double ref_lse = ref.log_sum_exp(b, h, i);
        const bool no_key = std::isinf(ref_lse) && ref_lse < 0;
        const bool nan_row = std::isnan(ref_lse);  // the row sees a NaN score
        for (index_t c = 0; c < ref.head_dim; ++c) {
          const float got = o(b, i, h, c);
          if (nan_row) {
            if (!std::isnan(got)) note("O of a row that sees a NaN is not NaN", b, i, h);
          } else if (const double want = ref.out(b, i, h, c); !std::isfinite(want)) {
            if (!(std::isnan(want) ? std::isnan(got) : static_cast<double>(got) == want))
              note("O differs from the reference's Inf or NaN", b, i, h);
          } else if (no_key) {
            if (got != 0.0f) note("O of a row with no visible key is not 0", b, i, h);
          } else if (!std::isfinite(got)) {
            note("O is not finite", b, i, h);
          } else {
            dev.o = std::max(dev.o, std::abs(static_cast<double>(got) - ref.out(b, i, h, c)));
          }
        }
        if (!lse.data) continue;
        const float got = lse(b, h, i);
        if (nan_row) {
          if (!std::isnan(got)) note("LSE of a row that sees a NaN is not NaN", b, i, h);
        } else if (no_key) {
          if (!(std::isinf(got) && got < 0)) note("LSE of a row with no visible key is not -inf", b, i, h);
        } else if (!std::isfinite(got)) {
          note("LSE is not finite", b, i, h);
        } else {
          dev.lse = std::max(dev.lse, std::abs(static_cast<double>(got) - ref_lse));
        }
      }
  return dev;
}

/// Standard attention in fp32 (materialized scores, max-subtracted softmax, float sums):
/// the "naive implementation in the same precision" of FlashAttention's accuracy rule.
/// Writes o through `o` and the LSE through `lse`.
inline void naive_fp32_attention(const TensorView<const float>& q, const TensorView<const float>& k,
                                 const TensorView<const float>& v, float scale, bool causal,
                                 const TensorView<float>& o, const LseView& lse) {
  const index_t B = q.shape[0], nq = q.shape[1], H = q.shape[2], D = q.shape[3], nk = k.shape[1];
  const index_t offset = nk - nq;
  std::vector<float> p(static_cast<std::size_t>(nk));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < nq; ++i) {
        float m = -std::numeric_limits<float>::infinity();
        for (index_t j = 0; j < nk; ++j) {
          float dot = 0.0f;
          for (index_t c = 0; c < D; ++c) dot += q(b, i, h, c) * k(b, j, h, c);
          p[j] = (causal && j > i + offset) ? -std::numeric_limits<float>::infinity() : scale * dot;
          m = std::max(m, p[j]);
        }
        if (std::isinf(m)) {
          for (index_t c = 0; c < D; ++c) o(b, i, h, c) = 0.0f;
          lse(b, h, i) = -std::numeric_limits<float>::infinity();
          continue;
        }
        float sum = 0.0f;
        for (index_t j = 0; j < nk; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (index_t c = 0; c < D; ++c) {
          float acc = 0.0f;
          for (index_t j = 0; j < nk; ++j) acc += p[j] * v(b, j, h, c);
          o(b, i, h, c) = acc / sum;
        }
        lse(b, h, i) = m + std::log(sum);
      }
}

// ---- Backends ------------------------------------------------------------------------------

/// The concrete backends compiled into this build: serial always, OpenMP and oneTBB when on.
inline std::vector<Backend> compiled_backends() {
  std::vector<Backend> out;
  for (Backend b : {Backend::serial, Backend::openmp, Backend::tbb})
    if (backend_available(b)) out.push_back(b);
  return out;
}

/// The softmax scale forward() uses by default, as a double for the reference.
inline double default_scale(index_t head_dim) {
  return static_cast<double>(1.0f / std::sqrt(static_cast<float>(head_dim)));
}

}  // namespace tileattn::test
