// tests/variants/variants_support.hpp: helpers shared by the forward-variant tests: fixed-length
// problems with GQA shapes and K/V as strided views into longer buffers, bias and mask
// buffers (contiguous, strided, broadcast, expanded with stride 0), packed variable-length
// problems, checks against the double reference (per sequence for varlen), the expected
// exception of a bad argument, and the analytic HBM traffic of the forward kernel.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace tileattn::test {

// ---- Shapes and K/V storage ----------------------------------------------------------------

/// A fixed-length problem's sizes; heads_q must be a multiple of heads_kv for valid calls.
struct Shape {
  index_t batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 32;
};

/// How K and V sit in memory. Both strided choices put them inside a longer buffer, so a
/// kernel that assumed contiguity (or mixed up K's and V's strides) reads the wrong rows.
enum class KvStorage {
  contiguous,   // two separate [B, Nk, Hkv, d] buffers (make_bshd)
  window,       // rows [5, 5 + Nk) of a padded [B, Nk + 9, Hkv, d + 3] buffer, one per tensor
  interleaved,  // one [B, Nk + 4, 2, Hkv, d + 1] buffer: K at [.., 2 + j, 0, ..], V at [.., 2 + j, 1, ..]
};

inline const char* to_string(KvStorage s) {
  switch (s) {
    case KvStorage::contiguous: return "contiguous";
    case KvStorage::window: return "window";
    case KvStorage::interleaved: return "interleaved";
  }
  return "unknown";
}

/// K and V over one or two buffers, with buffer contents drawn from N(0, 1).
class KvTensors {
 public:
  KvTensors(index_t batch, index_t seqlen, index_t heads, index_t head_dim, KvStorage storage,
            std::uint64_t seed) {
    const index_t B = batch, S = seqlen, H = heads, D = head_dim;
    switch (storage) {
      case KvStorage::contiguous:
        k_buffer_.resize(static_cast<std::size_t>(B * S * H * D));
        v_buffer_.resize(k_buffer_.size());
        k_ = make_bshd(k_buffer_.data(), B, S, H, D);
        v_ = make_bshd(v_buffer_.data(), B, S, H, D);
        break;
      case KvStorage::window: {
        const index_t rows = S + 9, dp = D + 3;
        k_buffer_.resize(static_cast<std::size_t>(B * rows * H * dp));
        v_buffer_.resize(k_buffer_.size());
        k_ = {k_buffer_.data() + 5 * H * dp, {B, S, H, D}, {rows * H * dp, H * dp, dp, 1}};
        v_ = {v_buffer_.data() + 5 * H * dp, {B, S, H, D}, {rows * H * dp, H * dp, dp, 1}};
        break;
      }
      case KvStorage::interleaved: {
        const index_t rows = S + 4, dp = D + 1;
        k_buffer_.resize(static_cast<std::size_t>(B * rows * 2 * H * dp));
        float* first = k_buffer_.data() + 2 * 2 * H * dp;
        k_ = {first, {B, S, H, D}, {rows * 2 * H * dp, 2 * H * dp, dp, 1}};
        v_ = {first + H * dp, {B, S, H, D}, {rows * 2 * H * dp, 2 * H * dp, dp, 1}};
        break;
      }
    }
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : k_buffer_) x = normal(rng);
    for (float& x : v_buffer_) x = normal(rng);
  }
  KvTensors(const KvTensors&) = delete;
  KvTensors& operator=(const KvTensors&) = delete;

  TensorView<const float> k() const { return k_; }
  TensorView<const float> v() const { return v_; }
  TensorView<float> mutable_k() { return k_; }
  TensorView<float> mutable_v() { return v_; }
  /// Multiplies every K element (padding too) by `factor`.
  void scale_k(float factor) {
    if (v_buffer_.empty()) {  // interleaved: K and V share the buffer
      for_each_index(k_.shape, [&](index_t b, index_t s, index_t h, index_t d) { k_(b, s, h, d) *= factor; });
    } else {
      for (float& x : k_buffer_) x *= factor;
    }
  }

 private:
  std::vector<float> k_buffer_, v_buffer_;
  TensorView<float> k_{}, v_{};
};

// ---- Bias and mask buffers ------------------------------------------------------------------

/// How a [B or 1, H or 1, Nq, Nk] bias or mask sits in its buffer.
enum class ScoreLayout {
  contiguous,  // row-major [B', H', Nq, Nk]
  transposed,  // keys outermost in each matrix: element (i, j) at j * (Nq + 2) + i
  expanded,    // one [Nq, Nk] matrix shown as [B, H, Nq, Nk] with batch and head strides 0
};

/// An owning bias (T = float) or mask (T = bool) buffer and its view.
template <class T>
class ScoreBuffer {
 public:
  /// shape = {B' , H', Nq, Nk}; value(b, h, i, j) gives each element (for `expanded`, only
  /// b = h = 0 is asked).
  ScoreBuffer(std::array<index_t, 4> shape, ScoreLayout layout,
              const std::function<T(index_t, index_t, index_t, index_t)>& value) {
    const index_t B = shape[0], H = shape[1], nq = shape[2], nk = shape[3];
    std::array<index_t, 4> stride{};
    std::size_t size = 0;
    switch (layout) {
      case ScoreLayout::contiguous:
        stride = {H * nq * nk, nq * nk, nk, 1};
        size = static_cast<std::size_t>(B * H * nq * nk);
        break;
      case ScoreLayout::transposed: {
        const index_t col = nq + 2, matrix = nk * col;
        stride = {H * matrix, matrix, 1, col};
        size = static_cast<std::size_t>(B * H * matrix);
        break;
      }
      case ScoreLayout::expanded:
        stride = {0, 0, nk, 1};
        size = static_cast<std::size_t>(nq * nk);
        break;
    }
    data_ = std::make_unique<T[]>(std::max<std::size_t>(size, 1));
    view_ = {data_.get(), shape, stride};
    const index_t bs = layout == ScoreLayout::expanded ? 1 : B, hs = layout == ScoreLayout::expanded ? 1 : H;
    for (index_t b = 0; b < bs; ++b)
      for (index_t h = 0; h < hs; ++h)
        for (index_t i = 0; i < nq; ++i)
          for (index_t j = 0; j < nk; ++j) view_(b, h, i, j) = value(b, h, i, j);
  }

  StridedView<const T, 4> view() const { return view_; }
  StridedView<T, 4> mutable_view() const { return view_; }

 private:
  std::unique_ptr<T[]> data_;
  StridedView<T, 4> view_{};
};

/// A bias of N(0, sigma) values.
inline ScoreBuffer<float> random_bias(std::array<index_t, 4> shape, ScoreLayout layout,
                                      std::uint64_t seed, float sigma = 1.0f) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return ScoreBuffer<float>(shape, layout, [rng, sigma](index_t, index_t, index_t, index_t) {
    return std::normal_distribution<float>(0.0f, sigma)(*rng);
  });
}

/// A mask where each entry is true with probability `density`.
inline ScoreBuffer<bool> random_mask(std::array<index_t, 4> shape, ScoreLayout layout,
                                     std::uint64_t seed, double density = 0.7) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return ScoreBuffer<bool>(shape, layout, [rng, density](index_t, index_t, index_t, index_t) {
    return std::bernoulli_distribution(density)(*rng);
  });
}

/// Values drawn uniformly from [lo, hi), e.g. ALiBi slopes or sink logits.
inline std::vector<float> uniform_values(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = u(rng);
  return out;
}

// ---- Checks ---------------------------------------------------------------------------------

/// Rows (over batch, head, query) whose reference LSE is -inf: rows that see no key.
inline index_t rows_without_keys(const reference::AttentionResult& ref) {
  index_t n = 0;
  for (double x : ref.lse) n += std::isinf(x) && x < 0;
  return n;
}

/// Whether a Deviation is within the forward bounds of support/test_support.hpp (5e-5 on O
/// and LSE; rows with no visible key exactly O = 0, LSE = -inf; no NaN anywhere).
inline ::testing::AssertionResult within_bounds(const Deviation& dev) {
  if (!dev.problem.empty()) return ::testing::AssertionFailure() << dev.problem;
  if (dev.o > forward_o_tolerance || dev.lse > forward_lse_tolerance)
    return ::testing::AssertionFailure() << "max |O error| " << dev.o << ", max |LSE error| "
                                         << dev.lse << " (bounds " << forward_o_tolerance << ", "
                                         << forward_lse_tolerance << ")";
  return ::testing::AssertionSuccess() << "max |O error| " << dev.o << ", max |LSE error| " << dev.lse;
}

/// Takes the larger errors and keeps the first problem.
inline void merge(Deviation& into, const Deviation& d, const std::string& where) {
  into.o = std::max(into.o, d.o);
  into.lse = std::max(into.lse, d.lse);
  if (into.problem.empty() && !d.problem.empty()) into.problem = where + ": " + d.problem;
}

// ---- Fixed-length problems ------------------------------------------------------------------

/// Q (contiguous), K and V (in `storage`), and O and LSE buffers filled with the sentinel.
class Problem {
 public:
  explicit Problem(const Shape& s, KvStorage storage = KvStorage::window, std::uint64_t seed = 1)
      : shape_(s),
        q_({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, Layout::bshd),
        kv_(s.batch, s.seqlen_k, s.heads_kv, s.head_dim, storage, seed + 1),
        o_({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, Layout::bshd),
        lse_(s.batch, s.heads_q, s.seqlen_q) {
    q_.fill_normal(seed);
    reset_outputs();
  }

  const Shape& shape() const { return shape_; }
  HostTensor& q() { return q_; }
  KvTensors& kv() { return kv_; }
  HostTensor& o() { return o_; }
  HostLse& lse() { return lse_; }

  void reset_outputs() {
    o_.fill(sentinel);
    lse_.fill(sentinel);
  }
  /// Runs tileattn::forward into O and LSE.
  void run(const ForwardOptions& opts) {
    forward(q_.cview(), kv_.k(), kv_.v(), o_.view(), lse_.view(), opts);
  }
  reference::AttentionResult reference(const ForwardOptions& opts) const {
    return reference::attention<float>(q_.cview(), kv_.k(), kv_.v(), reference::Options::from(opts));
  }
  /// Runs forward and compares O and LSE with the reference.
  Deviation run_and_compare(const ForwardOptions& opts) {
    run(opts);
    return compare_to_reference(reference(opts), o_.cview(), lse_.view());
  }
  /// O and LSE as written by the last run.
  std::vector<float> outputs() const {
    std::vector<float> out = o_.buffer();
    out.insert(out.end(), lse_.buffer().begin(), lse_.buffer().end());
    return out;
  }

 private:
  Shape shape_;
  HostTensor q_;
  KvTensors kv_;
  HostTensor o_;
  HostLse lse_;
};

// ---- Variable-length problems ---------------------------------------------------------------

/// A packed variable-length batch: Q, O [total_q + 3, Hq, d] (3 spare rows past the last
/// sequence, which must stay untouched), K/V [total_k, Hkv, d] interleaved in one longer
/// buffer, LSE [Hq, total_q + 3].
class VarlenProblem {
 public:
  VarlenProblem(std::vector<std::int32_t> q_lens, std::vector<std::int32_t> k_lens, index_t heads_q,
                index_t heads_kv, index_t head_dim, std::uint64_t seed = 1)
      : heads_q_(heads_q), head_dim_(head_dim) {
    cu_q_ = prefix_sums(q_lens);
    cu_k_ = prefix_sums(k_lens);
    max_q_ = *std::max_element(q_lens.begin(), q_lens.end());
    max_k_ = *std::max_element(k_lens.begin(), k_lens.end());
    rows_q_ = cu_q_.back() + spare_rows;
    const index_t total_k = std::max<index_t>(cu_k_.back(), 1);
    q_buffer_.resize(static_cast<std::size_t>(rows_q_ * heads_q * head_dim));
    o_buffer_.resize(q_buffer_.size());
    lse_buffer_.resize(static_cast<std::size_t>(heads_q * rows_q_));
    const index_t dp = head_dim + 1, kv_rows = total_k + 4;
    kv_buffer_.resize(static_cast<std::size_t>(kv_rows * 2 * heads_kv * dp));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : q_buffer_) x = normal(rng);
    for (float& x : kv_buffer_) x = normal(rng);
    float* first = kv_buffer_.data() + 2 * 2 * heads_kv * dp;
    k_ = {first, {total_k, heads_kv, head_dim}, {2 * heads_kv * dp, dp, 1}};
    v_ = {first + heads_kv * dp, {total_k, heads_kv, head_dim}, {2 * heads_kv * dp, dp, 1}};
    reset_outputs();
  }

  index_t batch() const { return static_cast<index_t>(cu_q_.size()) - 1; }
  index_t max_q() const { return max_q_; }
  index_t max_k() const { return max_k_; }
  index_t heads_q() const { return heads_q_; }
  const std::vector<std::int32_t>& cu_q() const { return cu_q_; }
  const std::vector<std::int32_t>& cu_k() const { return cu_k_; }

  PackedView<const float> q() const { return make_thd<const float>(q_buffer_.data(), rows_q_, heads_q_, head_dim_); }
  PackedView<const float> k() const { return k_; }
  PackedView<const float> v() const { return v_; }
  PackedView<float> o() { return make_thd(o_buffer_.data(), rows_q_, heads_q_, head_dim_); }
  PackedLseView lse() { return make_packed_lse(lse_buffer_.data(), heads_q_, rows_q_); }
  VarlenSequences sequences() const { return {cu_q_, cu_k_, max_q_, max_k_}; }

  void reset_outputs() {
    std::fill(o_buffer_.begin(), o_buffer_.end(), sentinel);
    std::fill(lse_buffer_.begin(), lse_buffer_.end(), sentinel);
  }
  void run(const ForwardOptions& opts) { forward_varlen(q(), k(), v(), o(), lse(), sequences(), opts); }

  /// The reference of sequence b alone (per-batch options selected with batch_index).
  reference::AttentionResult reference(index_t b, const ForwardOptions& opts) const {
    reference::Options ro = reference::Options::from(opts);
    ro.batch_index = b;
    const auto ub = static_cast<std::size_t>(b);
    return reference::attention<float>(
        reference::sequence_view(q(), cu_q_[ub], cu_q_[ub + 1] - cu_q_[ub]),
        reference::sequence_view(k(), cu_k_[ub], cu_k_[ub + 1] - cu_k_[ub]),
        reference::sequence_view(v(), cu_k_[ub], cu_k_[ub + 1] - cu_k_[ub]), ro);
  }
  /// Sequence b's O and LSE as [1, len, Hq, d] and [1, Hq, len] views.
  TensorView<const float> o_of(index_t b) const {
    const auto ub = static_cast<std::size_t>(b);
    return reference::sequence_view(make_thd<const float>(o_buffer_.data(), rows_q_, heads_q_, head_dim_),
                                    cu_q_[ub], cu_q_[ub + 1] - cu_q_[ub]);
  }
  LseView lse_of(index_t b) {
    const auto ub = static_cast<std::size_t>(b);
    return {lse_buffer_.data() + cu_q_[ub], {1, heads_q_, cu_q_[ub + 1] - cu_q_[ub]}, {0, rows_q_, 1}};
  }

  /// Runs forward_varlen and compares every sequence with its own reference. `masked_rows`,
  /// when given, receives the number of rows (all sequences and heads) that see no key.
  Deviation run_and_compare(const ForwardOptions& opts, index_t* masked_rows = nullptr) {
    run(opts);
    Deviation all;
    index_t masked = 0;
    for (index_t b = 0; b < batch(); ++b) {
      const auto ref = reference(b, opts);
      masked += rows_without_keys(ref);
      merge(all, compare_to_reference(ref, o_of(b), lse_of(b)), "sequence " + std::to_string(b));
    }
    if (masked_rows) *masked_rows = masked;
    return all;
  }

  /// Elements of O and LSE past the last sequence's rows that no longer hold the sentinel.
  index_t spare_rows_written() const {
    index_t n = 0;
    const index_t used = cu_q_.back();
    for (index_t r = used; r < rows_q_; ++r)
      for (index_t c = 0; c < heads_q_ * head_dim_; ++c)
        n += o_buffer_[static_cast<std::size_t>(r * heads_q_ * head_dim_ + c)] != sentinel;
    for (index_t h = 0; h < heads_q_; ++h)
      for (index_t r = used; r < rows_q_; ++r)
        n += lse_buffer_[static_cast<std::size_t>(h * rows_q_ + r)] != sentinel;
    return n;
  }
  std::vector<float> outputs() const {
    std::vector<float> out = o_buffer_;
    out.insert(out.end(), lse_buffer_.begin(), lse_buffer_.end());
    return out;
  }
  const std::vector<float>& o_buffer() const { return o_buffer_; }
  const std::vector<float>& lse_buffer() const { return lse_buffer_; }

 private:
  static constexpr index_t spare_rows = 3;

  static std::vector<std::int32_t> prefix_sums(const std::vector<std::int32_t>& lens) {
    std::vector<std::int32_t> cu(lens.size() + 1, 0);
    std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
    return cu;
  }

  index_t heads_q_, head_dim_;
  std::vector<std::int32_t> cu_q_, cu_k_;
  index_t max_q_ = 0, max_k_ = 0, rows_q_ = 0;
  std::vector<float> q_buffer_, o_buffer_, lse_buffer_, kv_buffer_;
  PackedView<const float> k_{}, v_{};
};

// ---- Bad arguments --------------------------------------------------------------------------

/// Whether `call` throws tileattn::invalid_argument whose parameter() is `parameter` (and
/// whose message names it).
template <class F>
::testing::AssertionResult throws_naming(F&& call, const std::string& parameter) {
  try {
    call();
  } catch (const invalid_argument& e) {
    if (e.parameter() != parameter)
      return ::testing::AssertionFailure() << "named '" << e.parameter() << "' instead of '"
                                           << parameter << "': " << e.what();
    if (std::string(e.what()).find(parameter) == std::string::npos)
      return ::testing::AssertionFailure() << "message does not name " << parameter << ": " << e.what();
    return ::testing::AssertionSuccess() << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something else: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw (expected '" << parameter << "')";
}

// ---- HBM traffic ----------------------------------------------------------------------------

/// Keys query position i of a sequence sees under a window [i + off - left, i + off + right]
/// (-1: unbounded), clamped to [0, nk): written out here independently of the kernel.
struct VisibleKeys {
  index_t offset, left, right, nk;
  index_t chunk = 0;  // attention_chunk (0: none): keys of position i + offset's chunk only
  index_t first(index_t i) const {
    index_t lo = left < 0 ? 0 : i + offset - left;
    if (chunk > 0) lo = std::max(lo, chunk_of(i) * chunk);
    return std::min(std::max<index_t>(lo, 0), nk);
  }
  index_t end(index_t i) const {
    index_t hi = right < 0 ? nk : i + offset + right + 1;
    if (chunk > 0) hi = std::min(hi, (chunk_of(i) + 1) * chunk);
    return std::min(std::max<index_t>(hi, 0), nk);
  }
  index_t chunk_of(index_t i) const {  // floor((i + offset) / chunk)
    const index_t position = i + offset;
    return position >= 0 ? position / chunk : -1 - (-position - 1) / chunk;
  }
};

/// K/V bytes the kernel reads for one sequence and one K/V head: every (head chunk, query
/// tile) streams keys [first(p0), end(p_last)) of K and of V once, from the start of the
/// key tile that holds first(p0) (key tiles sit at multiples of Bc).
inline std::uint64_t kv_bytes_per_kv_head(const TilePlan& plan, index_t group, index_t nq,
                                          const VisibleKeys& keys, index_t head_dim) {
  const index_t chunks = (group + plan.heads_per_tile - 1) / plan.heads_per_tile;
  std::uint64_t bytes = 0;
  for (index_t p0 = 0; p0 < nq; p0 += plan.query_tile_rows) {
    const index_t last = std::min(nq, p0 + plan.query_tile_rows) - 1;
    const index_t begin = keys.first(p0) / plan.key_tile_rows * plan.key_tile_rows;
    const index_t n = std::max<index_t>(0, keys.end(last) - begin);
    bytes += static_cast<std::uint64_t>(chunks * n * head_dim) * sizeof(float) * 2;
  }
  return bytes;
}

}  // namespace tileattn::test
