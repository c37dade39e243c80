"""tileattn: tiled, FlashAttention-style attention kernels for the CPU, for NumPy and PyTorch.

The calls here take NumPy arrays (or anything with ``__dlpack__``) in tileattn's layout,
``[batch, seqlen, heads, head_dim]`` with any strides, and return new arrays::

    import numpy as np, tileattn
    q = np.random.randn(2, 128, 8, 64).astype(np.float32)     # [B, N, H, D]
    k = np.random.randn(2, 128, 2, 64).astype(np.float32)     # GQA: 8 query heads, 2 K/V heads
    v = np.random.randn(2, 128, 2, 64).astype(np.float32)
    o, lse = tileattn.attention(q, k, v, causal=True)

PyTorch users call ``tileattn.torch`` (ops with autograd and ``torch.compile`` support, and
a drop-in for ``scaled_dot_product_attention``) and ``tileattn.transformers`` (an
``attn_implementation`` for Hugging Face models). Bad arguments raise
``tileattn.InvalidArgument`` (a ``ValueError``) whose ``parameter`` names the argument.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _C, flex
from ._C import BudgetError, InvalidArgument, OutOfPages

__version__ = "0.1.0"

__all__ = [
    "InvalidArgument", "BudgetError", "OutOfPages", "active_isa", "attention", "attention_backward",
    "attention_varlen", "attention_varlen_backward", "forward_paged", "write_kv_slots", "merge_states",
    "make_options", "flex_attention", "flex_attention_backward",
]


def active_isa() -> str:
    """The micro-kernel set this process runs (e.g. ``"avx512-bf16"``), chosen once at run time
    from the CPU (``TILEATTN_ISA=generic|avx2|avx512`` caps it)."""
    return _C.active_isa()


def make_options(*, softmax_scale: Optional[float] = None, causal: bool = False, top_left: bool = False,
                 window: Tuple[int, int] = (-1, -1), attention_chunk: int = 0, softcap: float = 0.0,
                 alibi_slopes=None, sinks=None, bias=None, mask=None, k_scale=None, v_scale=None,
                 num_threads: int = 0, num_splits: int = 0, batch_invariant: bool = False) -> "_C.Options":
    """The options object the low-level calls take (tileattn's ForwardOptions).

    ``causal`` is bottom-right aligned (FlashAttention) unless ``top_left`` (PyTorch SDPA's
    ``is_causal``); ``window`` is ``(left, right)``, -1 unbounded; ``attention_chunk`` > 0
    keeps each query to the keys of its chunk (Llama 4); ``batch_invariant`` makes a
    sequence's bits independent of the rest of its batch (docs/options.md); ``alibi_slopes`` and
    ``sinks`` are float32 [heads_q]; ``bias`` (float32) and ``mask`` (bool, True attends) are
    [B or 1, H or 1, seqlen_q, seqlen_k]; ``num_threads`` 0 means every hardware thread.
    """
    o = _C.Options()
    o.softmax_scale = softmax_scale
    o.causal = bool(causal)
    o.top_left = bool(top_left)
    o.window_left, o.window_right = int(window[0]), int(window[1])
    o.attention_chunk = int(attention_chunk)
    o.batch_invariant = bool(batch_invariant)
    o.softcap = float(softcap)
    o.alibi_slopes, o.sinks, o.bias, o.mask = alibi_slopes, sinks, bias, mask
    o.k_scale, o.v_scale = k_scale, v_scale
    o.num_threads = int(num_threads)
    o.num_splits = int(num_splits)
    return o


def _empty(shape, like) -> np.ndarray:
    return np.empty(shape, dtype=like.dtype)


def attention(q, k, v, *, return_lse: bool = True, **options):
    """Attention of q [B, Nq, Hq, D] to k [B, Nk, Hkv, D] and v [B, Nk, Hkv, Dv] (Hq % Hkv == 0).

    Returns ``(o, lse)``: o [B, Nq, Hq, Dv] in q's type, lse [B, Hq, Nq] float32 (natural log);
    only o when ``return_lse`` is False. ``options`` are ``make_options``'s.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    o = _empty(q.shape[:3] + v.shape[3:], q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32) if return_lse else None
    _C.forward(q, k, v, o, lse, make_options(**options))
    return (o, lse) if return_lse else o


def attention_backward(dout, q, k, v, o, lse, *, dsinks=None, dbias=None, **options):
    """dQ, dK, dV of ``attention(q, k, v, **options)`` given dO; writes d(sinks) and d(bias) into
    the float32 arrays ``dsinks`` / ``dbias`` when given (bias's shape)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    opts = make_options(**options)
    opts.dsinks, opts.dbias = dsinks, dbias
    _C.backward(q, k, v, o, lse, dout, dq, dk, dv, opts)
    return dq, dk, dv


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, **options):
    """Attention over packed sequences: q [total_q, Hq, D], k, v [total_k, Hkv, D(v)]; sequence b
    owns rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (int32). Returns ``(o, lse)``, lse [Hq, total_q]."""
    o = _empty(q.shape[:2] + v.shape[2:], q)
    lse = np.empty((q.shape[1], q.shape[0]), np.float32)
    _C.forward_varlen(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                      make_options(**options))
    return o, lse


def attention_varlen_backward(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                              max_seqlen_k: int, **options):
    """dQ, dK, dV of ``attention_varlen``."""
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _C.backward_varlen(q, k, v, o, lse, dout, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                       int(max_seqlen_k), make_options(**options))
    return dq, dk, dv


def forward_paged(q, k_cache, v_cache, block_table, cache_seqlens, *, kv_format: str = "", **options):
    """Attention of q [B, Nq, Hq, D] to paged pools [num_pages, page_size, Hkv, D(v)] through
    block_table [B, max_pages] and cache_seqlens [B] (int32), as vLLM and FlashAttention's
    ``flash_attn_with_kvcache`` pass them. 8-bit pools: int8 (with ``k_scale``/``v_scale``
    [num_pages or 1, Hkv or 1]), or uint8 bytes with ``kv_format="fp8_e4m3"`` or ``"fp8_e5m2"``.
    Returns ``(o, lse)``."""
    o = _empty(q.shape[:3] + v_cache.shape[3:], q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _C.forward_paged(q, k_cache, v_cache, block_table, cache_seqlens, o, lse, make_options(**options), kv_format)
    return o, lse


def write_kv_slots(k_new, v_new, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None,
                   kv_format: str = "") -> None:
    """Writes token i's rows of k_new, v_new [tokens, Hkv, D(v)] into slot ``slot_mapping[i]``
    (int64; page slot // page_size, row slot % page_size; -1 skips) of the pools, in place
    (vLLM's reshape_and_cache)."""
    _C.write_kv_slots(k_new, v_new, k_cache, v_cache, slot_mapping, k_scale, v_scale, kv_format)


def merge_states(o_a, lse_a, o_b, lse_b, num_threads: int = 0):
    """The attention over the union of two disjoint key sets from each one's (o, lse)
    ([B, N, H, Dv], [B, H, N]). Returns ``(o, lse)``."""
    o = np.empty_like(o_a)
    lse = np.empty_like(lse_a, dtype=np.float32)
    _C.merge_states(o_a, lse_a, o_b, lse_b, o, lse, int(num_threads))
    return o, lse


def flex_attention(q, k, v, *, mask=None, score_mod=None, block_size=(128, 128), return_lse: bool = True,
                   **options):
    """Flexible attention over the menu of ``tileattn.flex``: ``mask`` a list of clauses
    (ANDed), ``score_mod`` None or ``flex.RelativeBias``; ``options`` are ``make_options``'s
    (softcap, ALiBi, bias... apply before the score_mod). Returns ``(o, lse)``."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    o = _empty(q.shape[:3] + v.shape[3:], q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32) if return_lse else None
    _C.forward_flex(q, k, v, o, lse, make_options(**options), flex.spec(mask, score_mod, block_size))
    return (o, lse) if return_lse else o


def flex_attention_backward(dout, q, k, v, o, lse, *, mask=None, score_mod=None, block_size=(128, 128),
                            **options):
    """dQ, dK, dV of ``flex_attention`` with the same mask, score_mod and options."""
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _C.backward_flex(q, k, v, o, lse, dout, dq, dk, dv, make_options(**options),
                     flex.spec(mask, score_mod, block_size))
    return dq, dk, dv
