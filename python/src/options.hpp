// python/src/options.hpp: the options object Python fills in once per call (tileattn._C.Options)
// and how it becomes tileattn's ForwardOptions / BackwardOptions / PagedOptions. The arrays it
// holds (ALiBi slopes, sinks, bias, mask, 8-bit scales, dsinks, dbias) are kept alive by it.
#pragma once

#include <cstdint>
#include <optional>

#include "arrays.hpp"
#include "tileattn/backward.hpp"
#include "tileattn/paged.hpp"

namespace tileattn::python {

struct Options {
  std::optional<float> softmax_scale{};
  bool causal = false;
  bool top_left = false;  // PyTorch SDPA's is_causal alignment; bottom-right otherwise
  index_t window_left = -1, window_right = -1;
  index_t attention_chunk = 0;
  bool batch_invariant = false;
  float softcap = 0.0f;
  OptionalIn alibi_slopes{}, sinks{}, bias{}, mask{};
  OptionalIn k_scale{}, v_scale{};
  OptionalOut dsinks{}, dbias{};
  int num_threads = 0;
  std::size_t sram_budget_bytes = 0;
  index_t num_splits = 0;
  float dropout_p = 0.0f;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
};

/// The score options and execution of `o` as the kernels take them.
inline void fill(ForwardOptions& f, const Options& o) {
  f.softmax_scale = o.softmax_scale;
  f.causal = o.causal;
  f.alignment = o.top_left ? MaskAlignment::top_left : MaskAlignment::bottom_right;
  f.window_left = o.window_left;
  f.window_right = o.window_right;
  f.attention_chunk = o.attention_chunk;
  f.batch_invariant = o.batch_invariant;
  f.softcap = o.softcap;
  f.alibi_slopes = span_of<const float>(o.alibi_slopes, "alibi_slopes");
  f.sinks = span_of<const float>(o.sinks, "sinks");
  f.bias = view_of<const float, 4>(o.bias, "bias");
  f.mask = view_of<const bool, 4>(o.mask, "mask");
  f.k_scale = view_of<const float, 2>(o.k_scale, "k_scale");
  f.v_scale = view_of<const float, 2>(o.v_scale, "v_scale");
  f.dropout = {o.dropout_p, o.dropout_seed, o.dropout_offset};
  f.execution.num_threads = o.num_threads;
  f.sram_budget_bytes = o.sram_budget_bytes;
}

inline ForwardOptions forward_options(const Options& o) {
  ForwardOptions f;
  fill(f, o);
  return f;
}

inline BackwardOptions backward_options(const Options& o) {
  BackwardOptions b;
  fill(b, o);
  b.dsinks = span_of<float>(o.dsinks, "dsinks");
  b.dbias = view_of<float, 4>(o.dbias, "dbias");
  return b;
}

inline PagedOptions paged_options(const Options& o) {
  PagedOptions p;
  fill(p, o);
  p.num_splits = o.num_splits;
  return p;
}

}  // namespace tileattn::python
