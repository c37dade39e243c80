// tileattn/detail/forward_checks.hpp: every argument check of the forward entry points, run
// before any work starts so that a bad argument throws (naming it) with nothing written.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "tileattn/backend/parallel_for.hpp"
#include "tileattn/core/params.hpp"
#include "tileattn/detail/view_checks.hpp"
#include "tileattn/core/limits.hpp"

namespace tileattn::detail {

/// Which dimension of a Q/K/V/O view holds what: padded batches are [batch, seqlen, heads,
/// head_dim]; packed variable-length ones [total, heads, head_dim] (no batch dimension).
template <int R>
struct QkvLayout {
  std::array<const char*, static_cast<std::size_t>(R)> names;
  int batch, seqlen, heads, head_dim;
};
inline constexpr QkvLayout<4> padded_layout{{"batch", "seqlen", "heads", "head_dim"}, 0, 1, 2, 3};
inline constexpr QkvLayout<3> packed_layout{{"total", "heads", "head_dim"}, -1, 0, 1, 2};
inline constexpr std::array<const char*, 3> lse_dims{"batch", "heads", "seqlen_q"};
inline constexpr std::array<const char*, 2> packed_lse_dims{"heads", "total_q"};
inline constexpr std::array<const char*, 4> score_dims{"batch", "heads", "seqlen_q", "seqlen_k"};

inline void check_head_dim(index_t value, const std::string& name) {
  TILEATTN_REQUIRE(value >= 1 && value <= max_head_dim, name,
          "must be in [1, " + std::to_string(max_head_dim) + "], got " + std::to_string(value));
}

/// q and k share head_dim, v and o share head_dim_v (which may differ, as in DeepSeek's
/// multi-head latent attention); every other extent as the layout says.
template <class T, class KV, int R>
void check_qkvo(const StridedView<const T, R>& q, const StridedView<const KV, R>& k,
                const StridedView<const KV, R>& v, const StridedView<T, R>& o,
                const QkvLayout<R>& layout) {
  const auto& names = layout.names;
  check_view(q, "q", names);
  check_view(k, "k", names);
  check_view(v, "v", names);
  check_view(o, "o", names);
  const auto heads = static_cast<std::size_t>(layout.heads), head_dim = static_cast<std::size_t>(layout.head_dim);
  for (int d : {layout.batch, layout.head_dim})
    if (d >= 0) check_same_extent(q, "q", k, "k", static_cast<std::size_t>(d), names[static_cast<std::size_t>(d)]);
  TILEATTN_REQUIRE(q.shape[heads] % k.shape[heads] == 0,
          dim_name("k", "shape", heads, "heads"),
          "num_heads_q = " + std::to_string(q.shape[heads]) +
              " must be a multiple of num_heads_kv = " + std::to_string(k.shape[heads]));
  for (std::size_t d = 0; d < R; ++d)
    if (d != head_dim) check_same_extent(k, "k", v, "v", d, names[d]);
  for (std::size_t d = 0; d < R; ++d)
    if (d != head_dim) check_same_extent(q, "q", o, "o", d, names[d]);
  check_same_extent(v, "v", o, "o", head_dim, "head_dim_v");
  check_head_dim(q.shape[head_dim], "head_dim");
  check_head_dim(v.shape[head_dim], "head_dim_v");
}

/// An optional LSE output must have exactly the extents `want`.
template <int R>
void check_lse(const StridedView<float, R>& lse, const std::array<index_t, static_cast<std::size_t>(R)>& want,
               const std::array<const char*, static_cast<std::size_t>(R)>& names) {
  if (!lse.data) return;
  EmptyExtents<R> may_be_empty{};
  for (std::size_t d = 0; d < R; ++d) may_be_empty[static_cast<std::size_t>(d)] = want[static_cast<std::size_t>(d)] == 0;
  check_view(lse, "lse", names, may_be_empty);
  for (std::size_t d = 0; d < R; ++d)
    TILEATTN_REQUIRE(lse.shape[d] == want[d], dim_name("lse", "shape", d, names[d]),
            "must be " + std::to_string(want[d]) + ", got " + std::to_string(lse.shape[d]));
}

/// A bias or mask must be [B or 1, H or 1, seqlen_q, seqlen_k]. An empty side of a
/// variable-length batch (seqlen 0) takes an extent of 0 or 1 there; nothing is read.
template <class V>
void check_score_view(const V& v, const std::string& name, index_t batch, index_t heads,
                      index_t seqlen_q, index_t seqlen_k) {
  if (!v.data) return;
  const std::array<index_t, 4> want{batch, heads, seqlen_q, seqlen_k};
  check_view(v, name, score_dims, {false, false, seqlen_q == 0, seqlen_k == 0});
  for (std::size_t d = 0; d < 4; ++d) {
    const bool broadcast = (d < 2 || want[d] == 0) && v.shape[d] == 1;
    TILEATTN_REQUIRE(broadcast || v.shape[d] == want[d], dim_name(name, "shape", d, score_dims[d]),
            std::string("must be ") + (d < 2 || want[d] == 0 ? "1 or " : "") +
                std::to_string(want[d]) + ", got " + std::to_string(v.shape[d]));
  }
}

/// Every entry finite (or -inf where allowed) and below `magnitude` in absolute value.
inline void check_values(std::span<const float> values, const std::string& name,
                         bool allow_minus_infinity, double magnitude, const std::string& bound) {
  for (std::size_t i = 0; i < values.size(); ++i) {  // messages built only on failure
    const float x = values[i];
    if (!(std::isfinite(x) || (allow_minus_infinity && x < 0 && std::isinf(x))))
      throw invalid_argument(name, "entry " + std::to_string(i) + " is not finite");
    if (std::isfinite(x) && std::abs(static_cast<double>(x)) > magnitude)
      throw invalid_argument(name, "entry " + std::to_string(i) + " = " + readable(x) + " is too large: " + bound);
  }
}

/// Dropout's probability in [0, 1), its offset one counter word, and the call's sequences,
/// heads and positions within its stream's counter words (arch/philox.hpp); the paged calls
/// (inference) take no dropout.
template <class T, class KV>
void check_dropout(const ForwardParams<T, KV>& p, index_t batch, index_t seqlen_q, index_t seqlen_k) {
  const DropoutOptions& d = p.dropout;
  TILEATTN_REQUIRE(std::isfinite(d.p) && d.p >= 0.0f && d.p < 1.0f, "dropout.p",
                   "must be in [0, 1) (0: no dropout), got " + readable(d.p));
  if (!d.enabled()) return;
  TILEATTN_REQUIRE(!p.paged(), "dropout.p",
                   "must be 0 in the paged calls (inference); dropout is taken by forward, forward_varlen, "
                   "forward_flex and their backwards");
  constexpr std::uint64_t words = std::uint64_t{1} << 32;
  TILEATTN_REQUIRE(d.offset < words, "dropout.offset", "must be below 2^32, got " + std::to_string(d.offset));
  TILEATTN_REQUIRE(static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(p.heads()) <= words, "dropout.p",
                   "needs batch * heads_q <= 2^32 (one stream per sequence and head), got " +
                       std::to_string(batch) + " * " + std::to_string(p.heads()));
  TILEATTN_REQUIRE(static_cast<std::uint64_t>(seqlen_q) <= words && static_cast<std::uint64_t>(seqlen_k) <= 16 * words,
                   "dropout.p", "needs seqlen_q <= 2^32 and seqlen_k <= 2^36, got " + std::to_string(seqlen_q) +
                                    " and " + std::to_string(seqlen_k));
}

template <class T, class KV>
void check_options(const ForwardParams<T, KV>& p, index_t batch, index_t seqlen_q, index_t seqlen_k,
                   const Execution& exec) {
  const double max_log = max_natural_log_magnitude;
  TILEATTN_REQUIRE(std::isfinite(p.softmax_scale) && p.softmax_scale > 0.0f && p.softmax_scale <= max_log,
          "softmax_scale",
          "must be finite, > 0 and at most " + readable(max_natural_log_magnitude) +
              " (scale * log2(e) must be a finite float), got " + readable(p.softmax_scale));
  if (p.diagonal_offset) {
    const index_t off = *p.diagonal_offset;
    TILEATTN_REQUIRE(off >= -max_diagonal_offset && off <= max_diagonal_offset, "diagonal_offset",
            "must be within +-" + std::to_string(max_diagonal_offset) + " (2^48), got " + std::to_string(off));
  }
  TILEATTN_REQUIRE(p.window_left >= -1, "window_left", "must be >= -1 (-1: unbounded), got " + std::to_string(p.window_left));
  TILEATTN_REQUIRE(p.window_right >= -1, "window_right", "must be >= -1 (-1: unbounded), got " + std::to_string(p.window_right));
  TILEATTN_REQUIRE(p.attention_chunk >= 0, "attention_chunk", "must be >= 0 (0: off), got " + std::to_string(p.attention_chunk));
  TILEATTN_REQUIRE(std::isfinite(p.softcap) && p.softcap >= 0.0f && p.softcap <= max_log, "softcap",
          "must be finite, >= 0 (0: off) and at most " + readable(max_natural_log_magnitude) +
              " (softcap * log2(e) must be a finite float), got " + readable(p.softcap));
  if (!p.alibi_slopes.empty()) {
    const auto n = static_cast<index_t>(p.alibi_slopes.size());
    TILEATTN_REQUIRE(n == p.heads() || n == batch * p.heads(), "alibi_slopes",
            "needs heads_q = " + std::to_string(p.heads()) + " or batch * heads_q = " +
                std::to_string(batch * p.heads()) + " entries, got " + std::to_string(n));
    const double distance = static_cast<double>(seqlen_q + seqlen_k) +  // above any |i + offset - j|
                            std::abs(static_cast<double>(p.diagonal(seqlen_q, seqlen_k)));
    check_values(p.alibi_slopes, "alibi_slopes", false, max_log / 4 / std::max(distance, 1.0),
                 "|slope| * (seqlen_q + seqlen_k) must stay below " + readable(max_natural_log_magnitude / 4));
  }
  if (!p.sinks.empty()) {
    TILEATTN_REQUIRE(static_cast<index_t>(p.sinks.size()) == p.heads(), "sinks",
            "needs heads_q = " + std::to_string(p.heads()) + " entries, got " +
                std::to_string(p.sinks.size()));
    check_values(p.sinks, "sinks", true, max_log, "|sink| * log2(e) must be a finite float");
  }
  check_score_view(p.bias, "bias", batch, p.heads(), seqlen_q, seqlen_k);
  check_score_view(p.mask, "mask", batch, p.heads(), seqlen_q, seqlen_k);
  check_dropout(p, batch, seqlen_q, seqlen_k);
  validate_execution(exec);
}

/// An 8-bit K or V's scale view (KvScaleView): [rows or 1, heads_kv or 1] where rows is
/// the batch (contiguous K/V) or the pool's pages (paged), returned with broadcast extents
/// as stride 0 and full extents. Only 8-bit K/V take scales.
template <class KV>
KvScaleView resolve_kv_scale(const KvScaleView& s, const char* name, const char* rows_meaning, index_t rows,
                             index_t heads_kv) {
  if (!s.data) return s;
  TILEATTN_REQUIRE(quantized_type<KV>, name,
                   join({"is only taken by 8-bit K and V (fp8_e4m3, fp8_e5m2, int8); they hold ", kv_type_name<KV>()}));
  const std::array<const char*, 2> dims{rows_meaning, "heads_kv"};
  check_view(s, name, dims, {rows == 0, false});
  const std::array<index_t, 2> want{rows, heads_kv};
  KvScaleView out = s;
  for (std::size_t d = 0; d < 2; ++d) {
    TILEATTN_REQUIRE(s.shape[d] == want[d] || s.shape[d] == 1, dim_name(name, "shape", d, dims[d]),
                     "must be 1 or " + std::to_string(want[d]) + ", got " + std::to_string(s.shape[d]));
    if (s.shape[d] == 1) out = out.broadcast(static_cast<int>(d), want[d]);  // else shape[d] is want[d]
  }
  return out;
}

/// Resolves p's K and V scales (resolve_kv_scale) against `rows` batch entries or pages.
template <class T, class KV>
void set_kv_scales(ForwardParams<T, KV>& p, const ForwardOptions& options, const char* rows_meaning, index_t rows) {
  p.k_scale = resolve_kv_scale<KV>(options.k_scale, "k_scale", rows_meaning, rows, p.heads_kv());
  p.v_scale = resolve_kv_scale<KV>(options.v_scale, "v_scale", rows_meaning, rows, p.heads_kv());
}

/// An output must not overlap the integer arrays the kernels read while writing it: the
/// varlen cu_seqlens, the paged block table and cache_seqlens (those p points at).
template <class T, class KV, class Out>
void check_disjoint_from_indices(const ForwardParams<T, KV>& p, const Out& out, const std::string& name) {
  if (p.cu_seqlens_q) check_disjoint(out, name, array_view(p.cu_seqlens_q, p.num_sequences + 1), "cu_seqlens_q");
  if (p.cu_seqlens_k) check_disjoint(out, name, array_view(p.cu_seqlens_k, p.num_sequences + 1), "cu_seqlens_k");
  if (p.cache_seqlens) check_disjoint(out, name, array_view(p.cache_seqlens, p.batch()), "cache_seqlens");
  if (p.block_table.data) check_disjoint(out, name, p.block_table, "block_table");
}

/// An output must not overlap itself or any input of p (index arrays included).
template <class T, class KV, class Out>
void check_output(const ForwardParams<T, KV>& p, const Out& out, const std::string& name) {
  check_no_self_overlap(out, name);
  check_disjoint_from_indices(p, out, name);
  check_disjoint(out, name, p.q, "q");
  check_disjoint(out, name, p.k, "k");
  check_disjoint(out, name, p.v, "v");
  if (p.bias.data) check_disjoint(out, name, p.bias, "bias");
  if (p.mask.data) check_disjoint(out, name, p.mask, "mask");
  if (p.k_scale.data) check_disjoint(out, name, p.k_scale, "k_scale");
  if (p.v_scale.data) check_disjoint(out, name, p.v_scale, "v_scale");
  for (const auto& [values, what] : {std::pair{p.alibi_slopes, "alibi_slopes"}, std::pair{p.sinks, "sinks"}})
    if (!values.empty())
      check_disjoint(out, name, array_view(values), what);
}

/// Outputs must not overlap themselves, each other or any input.
template <class T, class KV>
void check_aliasing(const ForwardParams<T, KV>& p) {
  check_output(p, p.o, "o");
  if (!p.lse.data) return;
  check_output(p, p.lse, "lse");
  check_disjoint(p.lse, "lse", p.o, "o");
}

/// cu_seqlens: batch + 1 entries from 0, non-decreasing, within `total` rows, each length <= max.
/// Returns the longest length (computed only from entries checked: no overflow).
inline index_t check_cu_seqlens(std::span<const std::int32_t> cu, const std::string& name,
                             index_t batch, index_t total, index_t max_len,
                             const std::string& max_name) {
  TILEATTN_REQUIRE(static_cast<index_t>(cu.size()) == batch + 1, name,
          "needs batch + 1 = " + std::to_string(batch + 1) + " entries, got " + std::to_string(cu.size()));
  TILEATTN_REQUIRE(cu[0] == 0, name, "must start at 0, got " + std::to_string(cu[0]));
  index_t longest = 0;
  for (std::size_t b = 1; b < cu.size(); ++b) {  // messages built only on failure: batches can be long
    if (cu[b] < cu[b - 1])
      throw invalid_argument(name, "decreases at entry " + std::to_string(b) + " (" + std::to_string(cu[b - 1]) +
                                       " -> " + std::to_string(cu[b]) + ")");
    if (cu[b] - cu[b - 1] > max_len)
      throw invalid_argument(max_name, "sequence " + std::to_string(b - 1) + " has " +
                                           std::to_string(cu[b] - cu[b - 1]) + " rows, more than " +
                                           std::to_string(max_len));
    longest = std::max<index_t>(longest, cu[b] - cu[b - 1]);
  }
  TILEATTN_REQUIRE(cu.back() <= total, name,
          "ends at " + std::to_string(cu.back()) + ", past the " + std::to_string(total) + " rows of the buffer");
  return longest;
}

}  // namespace tileattn::detail
