// tileattn/core/params.hpp: the options users set and the params structs kernels consume.
//
// ForwardOptions / BackwardOptions are what a caller fills in. ForwardParams and
// BackwardParams are the resolved, validated inner currency handed to a kernel (as
// FlashAttention's Flash_fwd_params / Flash_bwd_params): views, the effective softmax
// scale, masks and score modifiers, and the sequence layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "tileattn/core/execution.hpp"
#include "tileattn/core/io_counts.hpp"
#include "tileattn/core/block_quantized_types.hpp"
#include "tileattn/core/quantized_types.hpp"
#include "tileattn/core/strided_view.hpp"

namespace tileattn {

/// Where the causal diagonal (and the window and ALiBi distances) are anchored when
/// seqlen_q != seqlen_k. bottom_right is FlashAttention >= 2.1 (query i is aligned with key
/// i + seqlen_k - seqlen_q); top_left is PyTorch SDPA's is_causal (query i with key i).
enum class MaskAlignment { bottom_right, top_left };

/// An additive float bias or boolean mask over scores, [B or 1, H or 1, seqlen_q, seqlen_k]
/// (extent 1 broadcasts; any non-negative strides). For variable-length batches the last two
/// extents are max_seqlen_q and max_seqlen_k and positions count from each sequence's start.
using ScoreBiasView = StridedView<const float, 4>;
using ScoreMaskView = StridedView<const bool, 4>;  // true: the query attends to the key

/// Attention dropout (FlashAttention's dropout_p, with its generator's seed and offset):
/// each probability P[i, j] is dropped (made 0) with probability p' = min(round(256 p), 255)
/// / 256 (p in steps of 1/256, as FlashAttention's CUDA kernels compare bytes), and O is
/// scaled by 1 / (1 - p'); the LSE is the undropped softmax's. Each decision is a pure
/// function of (seed, offset, sequence, query head, query position, key position), a byte of
/// Philox 4x32-10 (arch/philox.hpp gives the exact stream), so it is the same for every
/// backend, thread count, tile size and budget, and the backward regenerates the forward's
/// decisions from the same options. The forward, varlen and flex calls and their backwards
/// take it; the paged calls and ring attention (inference, or sharded positions) do not.
/// p = 0: off.
struct DropoutOptions {
  float p = 0.0f;           // in [0, 1)
  std::uint64_t seed = 0;   // Philox's key
  std::uint64_t offset = 0; // counter word 3; < 2^32 (a new value per call gives a new mask)
  bool enabled() const { return p != 0.0f; }
};

/// The options that change the math: masks and score modifiers. ForwardOptions (what users
/// set), ForwardParams (what kernels read) and the test reference all hold exactly these.
struct ScoreOptions {
  /// Causal mask: query i sees key j iff j <= i + offset, offset = seqlen_k - seqlen_q
  /// (bottom_right, the default), 0 (top_left) or diagonal_offset when set (below). Same as
  /// window_right = 0.
  bool causal = false;
  MaskAlignment alignment = MaskAlignment::bottom_right;
  /// When set, replaces `alignment`: query i is aligned with key i + diagonal_offset. For
  /// query and key blocks cut from one longer sequence, the offset is the key block's start
  /// minus the query block's in reverse (q_start - k_start): causal, window and ALiBi then
  /// see global positions (distributed/ring.hpp's chunk pairs). |offset| <= max_diagonal_offset.
  std::optional<index_t> diagonal_offset{};
  /// Sliding window: query i sees keys j with i + offset - window_left <= j <=
  /// i + offset + window_right; -1 means unbounded on that side (FlashAttention's window_size).
  index_t window_left = -1;
  index_t window_right = -1;
  /// Chunked local attention (Llama 4's attention_chunk, FlashAttention-3's): when > 0,
  /// query i sees key j only if i + offset and j lie in the same chunk of attention_chunk
  /// positions, floor((i + offset) / attention_chunk) == floor(j / attention_chunk); combined
  /// with causal, the window and the masks (all must let the key through). 0: off. Key
  /// tiles outside a query tile's chunks are skipped unloaded.
  index_t attention_chunk = 0;
  /// When > 0, scores s become softcap * tanh(s / softcap) before masking (Gemma-2).
  float softcap = 0.0f;
  /// ALiBi: one slope per query head, or batch * heads_q slopes (per sequence); the bias
  /// -slope * |i + offset - j| is added to the scaled scores.
  std::span<const float> alibi_slopes{};
  /// Attention sinks: one logit per query head that joins every row's softmax denominator
  /// with no value (in scaled-score units). LSE includes it.
  std::span<const float> sinks{};
  /// Optional additive bias (added after masking) and boolean mask; data == nullptr: none.
  ScoreBiasView bias{};
  ScoreMaskView mask{};
  /// Attention dropout (DropoutOptions): applied to P after the softmax, O scaled by 1 / (1 - p').
  DropoutOptions dropout{};

  /// The diagonal's offset for q_len queries and k_len keys: query i is aligned with key
  /// i + diagonal(q_len, k_len).
  index_t diagonal(index_t q_len, index_t k_len) const {
    if (diagonal_offset) return *diagonal_offset;
    return alignment == MaskAlignment::bottom_right ? k_len - q_len : 0;
  }
};

/// Dequantization scales of 8-bit K or V (core/quantized_types.hpp): the value of a stored
/// q is q * scale. Contiguous K/V (forward): [batch, heads_kv], FlashAttention-3's
/// k_descale / v_descale; paged pools (forward_paged): [num_pages, heads_kv], one scale per
/// (page, K/V head) as KvCache<int8> keeps them. Extent 1 broadcasts (one per K/V head, or
/// per tensor: shape {1, 1}); data == nullptr means scale 1. A non-finite scale makes the
/// values it scales non-finite (the rows that see them become NaN).
using KvScaleView = StridedView<const float, 2>;

/// A scale view of extents 1 x 1 for one scale shared by every key: per-tensor scaling.
inline KvScaleView per_tensor_scale(const float* scale) { return {scale, {1, 1}, {0, 0}}; }

/// Rotary position embedding (RoPE), FlashAttention's flash_attn_with_kvcache(rotary_cos,
/// rotary_sin, rotary_interleaved): the forward rotates Q at its positions as it loads it,
/// and KvCache::write / append and write_kv_slots rotate K as they write it (ops/rotary.hpp;
/// docs/paged.md, "Rotary embedding"). cos and sin are [max_position, rotary_dim / 2] float
/// tables (any non-negative strides) that the caller fills for any base or scaling (YaRN,
/// Llama 3, NTK): the first rotary_dim = 2 x cos.shape[1] features of a row at position p
/// rotate by the pairs (x1, x2) -> (x1 cos[p, c] - x2 sin[p, c], x1 sin[p, c] + x2 cos[p, c]),
/// pairs (x[c], x[c + rotary_dim / 2]) (GPT-NeoX, the default) or (x[2c], x[2c + 1])
/// (interleaved: GPT-J); the other features pass through. The result is rounded once to the
/// rotated tensor's storage type. Both tables null: no rotation. Values need not be finite (a
/// NaN in a row's entries makes that row NaN).
struct RotaryOptions {
  StridedView<const float, 2> cos{};
  StridedView<const float, 2> sin{};
  bool interleaved = false;

  bool enabled() const { return cos.data != nullptr || sin.data != nullptr; }
  index_t rotary_dim() const { return 2 * cos.shape[1]; }
};

struct ForwardOptions : ScoreOptions {
  /// Multiplies Q K^T before the softmax; unset means 1 / sqrt(head_dim).
  std::optional<float> softmax_scale;
  /// Rotary embedding of Q at its positions (RotaryOptions): query i of a sequence of q_len
  /// queries and k_len keys has position i + the diagonal's offset (ScoreOptions::diagonal:
  /// i + k_len - q_len by default, the new tokens being the last of the keys; in the paged
  /// calls k_len = cache_seqlens[b]). K is not rotated here: it was when it was written.
  RotaryOptions rotary{};
  /// Backend and thread count.
  Execution execution{};
  /// Each worker's SRAM budget in bytes; 0 means the detected per-core L2 cache.
  std::size_t sram_budget_bytes = 0;
  /// When set, receives the HBM bytes this call read and wrote (counted per tile move).
  IoCounts* io_counts = nullptr;
  /// Scales of K and V stored in 8 bits (fp8_e4m3, fp8_e5m2, int8); only those take them.
  KvScaleView k_scale{};
  KvScaleView v_scale{};
  /// Batch-invariant mode: every sequence's output bits (and, in the backward, its
  /// gradients' bits) are the same whatever else is in the batch, for reproducible rollouts
  /// and evaluations. The tiles are planned from the head dims, GQA group, element type and
  /// budget alone (not the batch's longest sequence or its size), and forward_paged's
  /// split-KV cuts every sequence at fixed multiples of kernels::invariant_split_keys keys
  /// (num_splits must be 0 or 1). Costs: short batches get no extra query tiles for idle
  /// threads, and split-KV no longer adapts its chunks to the batch (docs/options.md).
  bool batch_invariant = false;
};

/// The backward's options: the forward's (they must be the ones the forward ran with), and
/// the gradients of the two trained score parameters, written when the caller asks.
struct BackwardOptions : ForwardOptions {
  BackwardOptions() = default;
  /// The backward of a forward that ran with `forward` (docs/api.md): its options, with no
  /// gradient of the score parameters asked for yet.
  explicit BackwardOptions(const ForwardOptions& forward) : ForwardOptions(forward) {}

  /// d(loss)/d(sinks[h]), heads_q entries (needs sinks); empty: not computed.
  std::span<float> dsinks{};
  /// d(loss)/d(bias), the bias's own shape: dimensions it broadcasts (extent 1) are summed
  /// over. data == nullptr: not computed. Needs a bias.
  StridedView<float, 4> dbias{};
};

/// The paged calls' options (paged.hpp, flex.hpp, mla.hpp, topk.hpp): the forward's, and how
/// the plan cuts a batch's keys (kernels/key_split.hpp, kernels/paged_plan.hpp).
struct PagedOptions : ForwardOptions {
  /// Split-KV: 0 chooses from the batch's shape (kernels/key_split.hpp); 1 never splits;
  /// n > 1 cuts each sequence of at most 256 query rows (positions x group) into at most n
  /// key chunks. Never depends on the thread count.
  index_t num_splits = 0;
  /// Prefix-once attention: sequences whose block tables start with the same page ids
  /// (KvCache::fork, share_prefix) attend those keys once per group, all the members' query
  /// rows in one product, and merge the result with their own keys' exactly. The plan
  /// groups sequences that share at least shared_prefix_min_keys keys of whole pages, each
  /// of whose query rows sees every shared key and that have at most 256 query rows
  /// (positions x group; decode, verify). Not with ALiBi, a bias, a mask, batch_invariant or
  /// rotary (nor in forward_paged_flex): those calls run per sequence. false: never.
  bool shared_prefix = true;
  index_t shared_prefix_min_keys = 256;
};

/// Packed variable-length batches as in FlashAttention's varlen API: sequence b owns rows
/// [cu_seqlens_q[b], cu_seqlens_q[b+1]) of the packed Q and O, and likewise for K and V.
struct VarlenSequences {
  std::span<const std::int32_t> cu_seqlens_q;  // batch + 1 entries, non-decreasing, from 0
  std::span<const std::int32_t> cu_seqlens_k;  // batch + 1 entries, non-decreasing, from 0
  index_t max_seqlen_q = 0;
  index_t max_seqlen_k = 0;
};

/// One sequence's rows in the views: for fixed-length batches start = 0 and the view's batch
/// index is the sequence; for varlen the view has batch 1 and start comes from cu_seqlens.
struct SequenceRange {
  index_t view_batch;  // batch index into the Q/K/V/O views
  index_t q_start, q_len;
  index_t k_start, k_len;
};

/// Top-k sparse attention's keys (topk.hpp): the params' sequence s is one query row of
/// the batch's sequence sequence_of[s], whose keys are the cache positions
/// positions[begin[s]], ..., positions[begin[s + 1] - 1] (cache_seqlens[s] of them).
struct GatheredKeys {
  const std::int32_t* positions = nullptr;
  const index_t* begin = nullptr;
  const std::int32_t* sequence_of = nullptr;
};

/// T: the storage type of Q and O; KV: of K and V (T, an 8-bit type with scales, or a 4-bit
/// block type, whose K/V views index blocks: head_dim / values_per_element<KV> of them a row).
template <class T, class KV = T>
struct ForwardParams : ScoreOptions {
  using kv_type = KV;
  TensorView<const T> q;  // [batch, seqlen_q, heads_q, head_dim]
  TensorView<const KV> k;  // [batch, seqlen_k, heads_kv, head_dim]
  TensorView<const KV> v;  // [batch, seqlen_k, heads_kv, head_dim_v]
  TensorView<T> o;        // [batch, seqlen_q, heads_q, head_dim_v]
  LseView lse;            // [batch, heads_q, seqlen_q]; data == nullptr: not written
  // Each row's final statistics, like lse: its max score (log2 units) and its sum of
  // 2^(score - max), sinks folded in; data == nullptr: not written. The backward asks for
  // them where a float LSE is too coarse to recompute P from (kernels/backward.hpp).
  LseView row_max, row_sum;
  float softmax_scale = 1.0f;
  const std::int32_t* cu_seqlens_q = nullptr;  // varlen when set (batch of the views is 1)
  const std::int32_t* cu_seqlens_k = nullptr;
  index_t num_sequences = 0;                   // varlen: batch (paged too: varlen queries)
  // Paged K/V (forward_paged) when cache_seqlens is set: k and v are page pools
  // [num_pages, page_size, heads_kv, head_dim]; sequence b has cache_seqlens[b] keys, in the
  // pages block_table[b, 0], block_table[b, 1], ... in order.
  StridedView<const std::int32_t, 2> block_table{};
  const std::int32_t* cache_seqlens = nullptr;
  // Top-k sparse attention (kernels/gathered_kv.hpp) when set: each sequence is one query
  // row attending the keys it lists; nullptr: every key of the sequence.
  const GatheredKeys* gathered = nullptr;
  // Split-KV partial states (kernels/work_list.hpp): rows of head_dim_v floats, and each
  // row's max score (log2 units) and sum of 2^(score - max), kept apart (ops/merge_states.hpp).
  float* o_accum = nullptr;
  float* max_accum = nullptr;
  float* sum_accum = nullptr;
  // 8-bit K/V: scales [batch or num_pages, heads_kv] with broadcast extents as stride 0
  // (KvScaleView); data == nullptr: 1.
  KvScaleView k_scale{}, v_scale{};
  // Rotary embedding of Q as it is loaded (disabled when its tables are null).
  RotaryOptions rotary{};
  // MLA's latent (forward_paged_mla, mla.hpp): v is k's first head_dim_v columns, and each
  // key tile's V is made from its K tile in SRAM instead of read a second time.
  bool v_in_k = false;
  // Q rotated by H as it is loaded (after rotary), O by H as it is stored: set by forward_paged
  // over pools of hadamard_rotated<B> (whose blocks KV then is), never from an option.
  bool hadamard = false;

  bool varlen() const { return cu_seqlens_q != nullptr; }
  bool paged() const { return cache_seqlens != nullptr; }
  index_t batch() const { return varlen() ? num_sequences : q.shape[dim::batch]; }
  index_t heads() const { return q.shape[dim::heads]; }
  index_t heads_kv() const { return k.shape[dim::heads]; }
  index_t group_size() const { return heads() / heads_kv(); }
  index_t head_dim() const { return q.shape[dim::head_dim]; }    // Q and K
  index_t head_dim_v() const { return v.shape[dim::head_dim] * values_per_element<KV>; }  // V and O (4-bit V: blocks of values)

  SequenceRange sequence(index_t b) const {
    SequenceRange s{b, 0, q.shape[dim::seqlen], 0, k.shape[dim::seqlen]};
    if (varlen()) {
      s.view_batch = 0;
      s.q_start = cu_seqlens_q[b];
      s.q_len = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    }
    if (paged()) {
      s.k_len = cache_seqlens[b];
    } else if (varlen()) {
      s.k_start = cu_seqlens_k[b];
      s.k_len = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    }
    return s;
  }

  /// The diagonal's offset: query i is aligned with key i + mask_offset(s).
  index_t mask_offset(const SequenceRange& s) const { return diagonal(s.q_len, s.k_len); }
  /// Causal is the window's right edge at 0, whatever window_right says (as FlashAttention).
  index_t effective_window_right() const { return causal ? 0 : window_right; }
};

/// The backward's params: the forward's (its o and lse are unused) and the backward's
/// own tensors. O is the forward's output as stored, lse its log-sum-exp.
template <class T>
struct BackwardParams : ForwardParams<T> {
  TensorView<const T> out;                // O, like o
  StridedView<const float, 3> saved_lse;  // [batch, heads_q, seqlen_q]
  TensorView<const T> dout;               // dO, like o
  TensorView<T> dq, dk, dv;               // like q, k, v
  std::span<float> dsinks{};
  StridedView<float, 4> dbias{};
  // Where set (ring attention's partial gradients of one chunk pair, distributed/ring.hpp),
  // dQ, dK and dV are stored here in fp32, shaped like dq, dk, dv, which are then not
  // written: a sum of partial gradients rounds once, as one backward's does.
  TensorView<float> dq_fp32{}, dk_fp32{}, dv_fp32{};
};

}  // namespace tileattn
