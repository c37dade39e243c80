// tileattn/core/params.hpp: the options users set and the params struct kernels consume.
//
// ForwardOptions is what a caller fills in. ForwardParams is the resolved, validated
// inner currency handed to a kernel (as FlashAttention's Flash_fwd_params): views,
// the effective softmax scale, and flags.
#pragma once

#include <cstddef>
#include <optional>

#include "tileattn/backend/execution.hpp"
#include "tileattn/core/strided_view.hpp"
#include "tileattn/memory/io_counter.hpp"

namespace tileattn {

struct ForwardOptions {
  /// Multiplies Q K^T before the softmax; unset means 1 / sqrt(head_dim).
  std::optional<float> softmax_scale;
  /// Causal mask aligned to the bottom-right corner (FlashAttention >= 2.1): query i sees
  /// key j iff j <= i + seqlen_k - seqlen_q. Rows that see no key get O = 0, LSE = -inf.
  bool causal = false;
  /// Backend and thread count.
  Execution execution{};
  /// Each worker's SRAM budget in bytes; 0 means the detected per-core L2 cache.
  std::size_t sram_budget_bytes = 0;
  /// When set, receives the HBM bytes this call read and wrote (counted per tile move).
  IoCounts* io_counts = nullptr;
};

template <class T>
struct ForwardParams {
  TensorView<const T> q;  // [batch, seqlen_q, heads, head_dim]
  TensorView<const T> k;  // [batch, seqlen_k, heads, head_dim]
  TensorView<const T> v;  // [batch, seqlen_k, heads, head_dim]
  TensorView<T> o;        // [batch, seqlen_q, heads, head_dim]
  LseView lse;            // [batch, heads, seqlen_q]; data == nullptr: not written
  float softmax_scale = 1.0f;
  bool causal = false;

  index_t batch() const { return q.shape[dim::batch]; }
  index_t heads() const { return q.shape[dim::heads]; }
  index_t seqlen_q() const { return q.shape[dim::seqlen]; }
  index_t seqlen_k() const { return k.shape[dim::seqlen]; }
  index_t head_dim() const { return q.shape[dim::head_dim]; }
  /// Key index j is visible to query i under the causal mask iff j <= i + causal_offset().
  index_t causal_offset() const { return seqlen_k() - seqlen_q(); }
};

}  // namespace tileattn
