// tileattn/flex/mods.hpp: the score and mask functors of flexible attention (flex.hpp),
// what a user functor must look like, and a library of the common ones.
//
// A mask_mod is a callable bool(index_t b, index_t h, index_t q_idx, index_t kv_idx): true
// when query q_idx of sequence b, query head h, attends to key kv_idx (PyTorch
// FlexAttention's mask_mod). A score_mod is a callable float(float score, index_t b,
// index_t h, index_t q_idx, index_t kv_idx) returning the modified score; `score` is
// softmax_scale * q.k in natural-log units (FlexAttention's score_mod). For the backward, a
// score_mod also provides its derivative as a member grad(score, b, h, q_idx, kv_idx), the
// derivative of the result by `score` (flex::with_grad pairs a lambda with its derivative).
// Positions count from each sequence's start (varlen: within the sequence).
//
// The library's functors are templates over the score type, so the tests' double
// reference evaluates them in double; a user's functor may take float only.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>

#include "tileattn/core/strided_view.hpp"

namespace tileattn {

/// A callable usable as a mask_mod.
template <class M>
concept mask_mod_function = std::is_invocable_r_v<bool, const M&, index_t, index_t, index_t, index_t>;

/// A callable usable as a score_mod.
template <class F>
concept score_mod_function = std::is_invocable_r_v<float, const F&, float, index_t, index_t, index_t, index_t>;

/// A score_mod that also gives its derivative (what the backward needs).
template <class F>
concept score_mod_with_grad = score_mod_function<F> && requires(const F& f, float s, index_t i) {
  { f.grad(s, i, i, i, i) } -> std::convertible_to<float>;
};

namespace flex {

/// The identity score_mod: no score modification (the kernel runs its plain path).
struct no_score_mod {
  template <class S>
  S operator()(S score, index_t, index_t, index_t, index_t) const { return score; }
  template <class S>
  S grad(S, index_t, index_t, index_t, index_t) const { return S(1); }
};

/// The mask_mod that hides nothing (the kernel evaluates no mask).
struct no_mask {
  bool operator()(index_t, index_t, index_t, index_t) const { return true; }
};

// ---------------------------------------------------------------------------------------
// Masks

/// Causal: query i sees keys j <= i + offset. offset 0 is FlexAttention's and PyTorch's
/// top-left diagonal; seqlen_k - seqlen_q is FlashAttention's bottom-right one.
struct causal {
  index_t offset = 0;
  bool operator()(index_t, index_t, index_t q, index_t kv) const { return kv <= q + offset; }
};

/// Sliding window around the diagonal i + offset: keys j with i + offset - left <= j <=
/// i + offset + right (a side of -1 is unbounded; right = 0 is a causal window).
struct sliding_window {
  index_t left = -1, right = 0, offset = 0;
  bool operator()(index_t, index_t, index_t q, index_t kv) const {
    const index_t d = q + offset - kv;  // distance to the left of the diagonal
    return (left < 0 || d <= left) && (right < 0 || -d <= right);
  }
};

/// Document mask for packed training batches: a query sees the keys of its own document.
/// doc_q[i] / doc_kv[j] give each position's document id (one array for self-attention).
/// The arrays must outlive the mask.
struct document {
  std::span<const std::int32_t> doc_q, doc_kv;
  explicit document(std::span<const std::int32_t> ids) : doc_q(ids), doc_kv(ids) {}
  document(std::span<const std::int32_t> q_ids, std::span<const std::int32_t> kv_ids) : doc_q(q_ids), doc_kv(kv_ids) {}
  bool operator()(index_t, index_t, index_t q, index_t kv) const {
    return doc_q[static_cast<std::size_t>(q)] == doc_kv[static_cast<std::size_t>(kv)];
  }
};

/// Prefix-LM: the first `prefix` keys are seen by every query (bidirectional prefix), the
/// rest causally (top-left).
struct prefix_lm {
  index_t prefix = 0;
  bool operator()(index_t, index_t, index_t q, index_t kv) const { return kv < prefix || kv <= q; }
};

/// Longformer's global tokens with a sliding window: the first `globals` positions see and
/// are seen by every position; the others see keys within `window` on each side.
struct global_window {
  index_t globals = 0, window = 0;
  bool operator()(index_t, index_t, index_t q, index_t kv) const {
    return q < globals || kv < globals || (q - kv <= window && kv - q <= window);
  }
};

/// A dilated causal window: keys i - j = 0, dilation, 2 dilation, ... up to window * dilation.
struct dilated_window {
  index_t window = 0, dilation = 1;
  bool operator()(index_t, index_t, index_t q, index_t kv) const {
    const index_t d = q - kv;
    return d >= 0 && d <= window * dilation && d % dilation == 0;
  }
};

/// Block-sparse attention from a layout of blocks (BigBird, the FlashAttention paper's
/// block-sparse kernel): layout[qb * kv_blocks + kb] != 0 when query block qb sees key block
/// kb, blocks of `block` x `block` positions. The layout must outlive the mask. A block mask
/// (flex/block_mask.hpp) built with the same block size finds its blocks exactly.
struct block_sparse {
  std::span<const std::uint8_t> layout;
  index_t kv_blocks = 0, block = 128;
  bool operator()(index_t, index_t, index_t q, index_t kv) const {
    return layout[static_cast<std::size_t>(q / block * kv_blocks + kv / block)] != 0;
  }
};

/// Both masks: a position is seen when `a` and `b` both see it.
template <class A, class B>
struct and_masks {
  A a;
  B b;
  bool operator()(index_t bi, index_t h, index_t q, index_t kv) const { return a(bi, h, q, kv) && b(bi, h, q, kv); }
};
template <class A, class B>
and_masks(A, B) -> and_masks<A, B>;

/// Either mask: a position is seen when `a` or `b` sees it.
template <class A, class B>
struct or_masks {
  A a;
  B b;
  bool operator()(index_t bi, index_t h, index_t q, index_t kv) const { return a(bi, h, q, kv) || b(bi, h, q, kv); }
};
template <class A, class B>
or_masks(A, B) -> or_masks<A, B>;

// ---------------------------------------------------------------------------------------
// Score modifiers (each with its derivative)

/// ALiBi: score - slopes[h] * |i + offset - j|, one slope per query head (the built-in
/// option's bias with offset = the call's mask offset).
struct alibi {
  std::span<const float> slopes;
  index_t offset = 0;
  template <class S>
  S operator()(S score, index_t, index_t h, index_t q, index_t kv) const {
    const index_t d = q + offset - kv;
    return score - static_cast<S>(slopes[static_cast<std::size_t>(h)]) * static_cast<S>(d < 0 ? -d : d);
  }
  template <class S>
  S grad(S, index_t, index_t, index_t, index_t) const { return S(1); }
};

/// Softcap (Gemma 2): cap * tanh(score / cap), cap > 0.
struct softcap {
  float cap = 1.0f;
  template <class S>
  S operator()(S score, index_t, index_t, index_t, index_t) const {
    return static_cast<S>(cap) * std::tanh(score / static_cast<S>(cap));
  }
  template <class S>
  S grad(S score, index_t, index_t, index_t, index_t) const {
    const S t = std::tanh(score / static_cast<S>(cap));
    return S(1) - t * t;
  }
};

/// A relative position bias from a learned table (T5, Swin): score + table[h][clamp(i - j,
/// -max_distance, max_distance) + max_distance], `table` holding 2 max_distance + 1 entries
/// per head (heads x (2 max_distance + 1), row-major). The table must outlive the functor.
struct relative_bias {
  std::span<const float> table;
  index_t max_distance = 0;
  template <class S>
  S operator()(S score, index_t, index_t h, index_t q, index_t kv) const {
    const index_t d = std::clamp<index_t>(q - kv, -max_distance, max_distance) + max_distance;
    return score + static_cast<S>(table[static_cast<std::size_t>(h * (2 * max_distance + 1) + d)]);
  }
  template <class S>
  S grad(S, index_t, index_t, index_t, index_t) const { return S(1); }
};

/// A score_mod from two callables: the function and its derivative by the score.
template <class F, class G>
struct with_grad {
  F f;
  G g;
  template <class S>
  S operator()(S score, index_t b, index_t h, index_t q, index_t kv) const { return f(score, b, h, q, kv); }
  template <class S>
  S grad(S score, index_t b, index_t h, index_t q, index_t kv) const { return g(score, b, h, q, kv); }
};
template <class F, class G>
with_grad(F, G) -> with_grad<F, G>;

}  // namespace flex
}  // namespace tileattn
