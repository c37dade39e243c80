// tileattn/detail/topk_checks.hpp: the argument checks of forward_paged_topk (topk.hpp),
// run before any work starts so that a bad argument throws (naming it) with nothing
// written, and the compaction of each query row's selected keys that the checks walk anyway.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tileattn/core/params.hpp"
#include "tileattn/detail/view_checks.hpp"
#include "tileattn/ops/score_mods.hpp"

namespace tileattn::detail {

inline constexpr std::array<const char*, 3> topk_dims{"batch", "seqlen_q", "topk"};

/// topk_indices [batch, seqlen_q, topk] (packed: [1, total_q, topk]) against the queries.
inline void check_topk_shape(const StridedView<const std::int32_t, 3>& idx, index_t batch, index_t seqlen_q) {
  check_view(idx, "topk_indices", topk_dims, {false, true, true});
  TILEATTN_REQUIRE(idx.shape[0] == batch, "topk_indices.shape[0] (batch)",
                   "must equal q's batch, " + std::to_string(batch) + ", got " + std::to_string(idx.shape[0]));
  TILEATTN_REQUIRE(idx.shape[1] == seqlen_q, "topk_indices.shape[1] (seqlen_q)",
                   "must equal q's query rows, " + std::to_string(seqlen_q) + ", got " + std::to_string(idx.shape[1]));
}

/// O and the LSE (outputs) must not overlap topk_indices (an input), as forward_paged's
/// outputs must not overlap its block table or cache_seqlens.
template <class T, class KV>
void check_topk_apart(const ForwardParams<T, KV>& p, const StridedView<const std::int32_t, 3>& idx) {
  check_disjoint(p.o, "o", idx, "topk_indices");
  if (p.lse.data) check_disjoint(p.lse, "lse", idx, "topk_indices");
}

/// The options whose scores depend on a key's place in a dense row, which a compact list of
/// selected keys does not have: ALiBi, a bias or mask over [seqlen_q, seqlen_k], rotary
/// embedding of Q at the row's position. Causal, the window and the attention chunk are
/// supported (they drop keys from the lists); softcap, sinks and the scale need no position.
inline void check_topk_options(const ForwardOptions& options) {
  TILEATTN_REQUIRE(options.alibi_slopes.empty(), "alibi_slopes", "is not supported by forward_paged_topk");
  TILEATTN_REQUIRE(!options.bias.data, "bias", "is not supported by forward_paged_topk (topk_indices select the keys)");
  TILEATTN_REQUIRE(!options.mask.data, "mask", "is not supported by forward_paged_topk (topk_indices select the keys)");
  TILEATTN_REQUIRE(!options.rotary.enabled(), "rotary", "is not supported by forward_paged_topk (rotate Q before the call)");
}

/// Every query row's selected keys, checked and compacted: the params' sequence s of the
/// top-k run (ForwardParams::gathered) is query row s, row after row of the batch.
struct TopkRows {
  std::vector<std::int32_t> positions;    // the rows' kept keys, row after row
  std::vector<index_t> begin{0};          // row s keeps positions[begin[s], begin[s + 1])
  std::vector<std::int32_t> counts;       // begin[s + 1] - begin[s]: the run's cache_seqlens
  std::vector<std::int32_t> sequence_of;  // row s's sequence of the batch
  std::vector<std::int32_t> cu_rows{0};   // 0, 1, ..., rows: one query row per sequence
  index_t longest = 0;

  index_t rows() const { return static_cast<index_t>(counts.size()); }
  GatheredKeys keys() const { return {positions.data(), begin.data(), sequence_of.data()}; }
};

/// The rows of p's batch (sequence b's query i is row b * seqlen_q + i, or its packed row),
/// each keeping the entries of its topk_indices row that are not -1 and that its causal
/// mask, window and attention chunk let it see, in their order (a duplicate is kept twice).
/// An entry outside [-1, cache_seqlens[b]) throws, naming topk_indices.
template <class T, class KV>
TopkRows topk_rows(const ForwardParams<T, KV>& p, const StridedView<const std::int32_t, 3>& idx) {
  TopkRows rows;
  const index_t k = idx.shape[2];
  rows.positions.reserve(static_cast<std::size_t>(std::max<index_t>(idx.shape[0] * idx.shape[1] * k, 1)));
  rows.counts.reserve(static_cast<std::size_t>(std::max<index_t>(idx.shape[0] * idx.shape[1], 1)));  // never null
  for (index_t b = 0; b < p.batch(); ++b) {
    const SequenceRange seq = p.sequence(b);
    const ops::KeyWindow window = ops::KeyWindow::of(p, seq);
    for (index_t i = 0; i < seq.q_len; ++i) {
      const std::int32_t* entry = idx.ptr(seq.view_batch, seq.q_start + i, 0);
      const index_t first = window.first(i), end = window.end(i);
      for (index_t j = 0; j < k; ++j) {
        const index_t key = entry[j * idx.stride[2]];
        if (key < -1 || key >= seq.k_len)  // the message is built only on failure
          throw invalid_argument("topk_indices", "entry [" + std::to_string(seq.view_batch) + ", " +
                                                     std::to_string(seq.q_start + i) + ", " + std::to_string(j) +
                                                     "] = " + std::to_string(key) +
                                                     " must be -1 (no key) or a key of sequence " + std::to_string(b) +
                                                     ", in [0, cache_seqlens = " + std::to_string(seq.k_len) + ")");
        if (key >= first && key < end) rows.positions.push_back(static_cast<std::int32_t>(key));
      }
      const index_t kept = static_cast<index_t>(rows.positions.size()) - rows.begin.back();
      rows.begin.push_back(static_cast<index_t>(rows.positions.size()));
      rows.counts.push_back(static_cast<std::int32_t>(kept));
      rows.sequence_of.push_back(static_cast<std::int32_t>(b));
      rows.cu_rows.push_back(static_cast<std::int32_t>(rows.counts.size()));
      rows.longest = std::max(rows.longest, kept);
    }
  }
  return rows;
}

}  // namespace tileattn::detail
