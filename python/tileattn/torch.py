"""tileattn's kernels as PyTorch ops: ``torch.library`` custom ops with fake (meta)
implementations, so ``torch.compile(fullgraph=True)`` traces them, and autograd.

    import torch, tileattn.torch as ta
    out = ta.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # SDPA's call
    out, lse = ta.attention(q, k, v, causal=True, window=(256, 0), sinks=sinks)   # [B, N, H, D]

Tensors are seen in place (any strides, no copy) through DLPack; the kernels run with the
GIL released on ``torch.get_num_threads()`` threads. Storage types: float32, bfloat16, float16
(float64 is refused: the kernels accumulate in float32, see docs/python.md).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _C
from ._errors import invalid as _invalid
from . import flex as _flex

__all__ = [
    "attention", "attention_varlen", "scaled_dot_product_attention", "forward_paged", "write_kv_slots",
    "merge_states", "flex_attention", "PagedDecode",
]

_STORAGE = (torch.float32, torch.bfloat16, torch.float16)


def _check_storage(name: str, t: Tensor) -> None:
    if t.dtype not in _STORAGE:
        raise _invalid(
            name, f"must hold float32, bfloat16 or float16, got {str(t.dtype).replace('torch.', '')}"
            + (" (the kernels accumulate in float32; cast to float32)" if t.dtype == torch.float64 else ""))
    if t.device.type != "cpu":
        raise _invalid(name, f"must be on the CPU, got {t.device}")


_to_dlpack = torch.utils.dlpack.to_dlpack


def _dl(t: Optional[Tensor]):
    """A tensor as the DLPack capsule the extension reads it through: torch's to_dlpack costs
    ~0.2 us a tensor, the __dlpack__ method nanobind would call ~2.3 us (measured: a decode
    call's five tensors took 11 us of its 14)."""
    return None if t is None else _to_dlpack(t)


def _run(kernel, *args):
    """Calls an extension function with its tensor arguments as DLPack capsules."""
    return kernel(*[_to_dlpack(a) if isinstance(a, Tensor) else a for a in args])


def _eager(*tensors: Optional[Tensor]) -> bool:
    """Whether a call may run the op's implementation directly, below PyTorch's dispatcher
    (which costs ~16 us a call, a few percent of a decode step): plain CPU tensors, no
    gradient asked for, and nothing tracing or transforming the call (torch.compile, FX,
    functorch, dispatch and function modes). Otherwise the registered op runs."""
    if torch.compiler.is_compiling() or _modes_active():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or (grad and t.requires_grad)):
            return False
    return True


def _modes_active() -> bool:
    c = torch._C
    for name in ("_are_functorch_transforms_active", "_len_torch_dispatch_stack", "_len_torch_function_stack"):
        f = getattr(c, name, None)
        if f is None or f():
            return True
    return False


def _float32(t: Optional[Tensor]) -> Optional[Tensor]:
    """t in float32 (a differentiable conversion where it is another dtype): sinks, ALiBi slopes,
    biases and tables are float32 in the kernels."""
    return t if t is None or t.dtype == torch.float32 else t.float()


def _as_float(t: Optional[Tensor]) -> Optional[Tensor]:
    """The same, detached, inside an op (a caller that bypassed the wrappers)."""
    if t is None:
        return None
    return t.detach() if t.dtype == torch.float32 else t.detach().float()


def _options(scale: Optional[float], causal: bool, top_left: bool, window_left: int, window_right: int,
             softcap: float, alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], bias: Optional[Tensor],
             mask: Optional[Tensor]) -> "_C.Options":
    o = _C.Options()
    o.softmax_scale = scale
    o.causal = causal
    o.top_left = top_left
    o.window_left = window_left
    o.window_right = window_right
    o.softcap = softcap
    o.alibi_slopes = _dl(_as_float(alibi_slopes))
    o.sinks = _dl(_as_float(sinks))
    o.bias = _dl(_as_float(bias))
    o.mask = _dl(mask)
    o.num_threads = torch.get_num_threads()
    return o


def _set_dropout(o: "_C.Options", dropout_p: float, rng: Optional[Tensor]) -> "_C.Options":
    """Dropout's probability and stream (rng: int64 [seed, offset]) on the options."""
    if dropout_p != 0.0:
        if rng is None:  # an op called directly (the wrappers always give one)
            raise _invalid("dropout_rng", "must be given (an int64 tensor [seed, offset]) when dropout_p > 0")
        seed, offset = (int(x) for x in rng.tolist())
        o.dropout_p = dropout_p
        o.dropout_seed = seed & 0xFFFFFFFFFFFFFFFF
        o.dropout_offset = offset
    return o


def _dropout_rng(dropout_p: float, rng: Optional[Tensor],
                 generator: Optional[torch.Generator] = None) -> Optional[Tensor]:
    """Checks dropout_p and returns the stream a call with it uses: rng as given (an int64 tensor
    [seed, offset], offset < 2**32), else a seed drawn from torch's generator (``torch.manual_seed``
    makes it reproducible; traceable by torch.compile) with offset 0; None without dropout."""
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= float(dropout_p) < 1.0:
        raise _invalid("dropout_p", f"must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return None
    if rng is None:
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, generator=generator)
        return torch.cat([seed, torch.zeros(1, dtype=torch.int64)])
    if not isinstance(rng, Tensor) or rng.dtype != torch.int64 or tuple(rng.shape) != (2,):
        raise _invalid("dropout_rng", "must be an int64 tensor [seed, offset]")
    if not torch.compiler.is_compiling() and not 0 <= int(rng[1]) < 2**32:
        raise _invalid("dropout_rng", f"offset must be in [0, 2**32), got {int(rng[1])}")
    return rng


def _effective_scale(scale: Optional[float]) -> Tuple[Optional[float], float]:
    """PyTorch accepts any finite scale; the kernels take scale > 0. scale < 0 runs -q at |scale|
    and scale 0 runs q = 0 at scale 1 (negation is exact), so the scores are the same.
    Returns (scale to run, d(q run)/dq: 1, -1 or 0)."""
    if scale is None or scale > 0 or not math.isfinite(scale):
        return scale, 1.0
    return (-scale, -1.0) if scale < 0 else (1.0, 0.0)


def _q_to_run(q: Tensor, sign: float) -> Tensor:
    """q times _effective_scale's sign (1: q itself)."""
    if sign == 1.0:
        return q
    return -q if sign < 0 else torch.zeros_like(q)


def _effective_q(q: Tensor, scale: Optional[float]) -> Tuple[Tensor, Optional[float], float]:
    """(q to run, scale to run, d(q run)/dq) for a call with `scale` (_effective_scale)."""
    scale_run, sign = _effective_scale(scale)
    return _q_to_run(q, sign), scale_run, sign


def _dense_outputs(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """Checks q, k, v's storage and allocates out [B, Nq, Hq, Dv] (q's dtype) and lse [B, Hq, Nq]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_storage(name, t)
    B, Nq, Hq, _ = q.shape
    return q.new_empty((B, Nq, Hq, v.shape[3])), q.new_empty((B, Hq, Nq), dtype=torch.float32)


def _chain_dq(dq: Tensor, sign: float) -> Tensor:
    """dQ from the gradient of the q the kernel ran (_effective_q): negated or zero."""
    if sign == 1.0:
        return dq
    return dq.neg_() if sign < 0 else dq.zero_()


def _split_mask(attn_mask: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """An SDPA-style attn_mask as (bias, mask): a bool one is a mask (True attends), any other
    an additive bias."""
    if attn_mask is None:
        return None, None
    return (None, attn_mask) if attn_mask.dtype == torch.bool else (attn_mask, None)


# ----------------------------------------------------------------------------------------------
# The dense op: q [B, Nq, Hq, D], k [B, Nk, Hkv, D], v [B, Nk, Hkv, Dv] (tileattn's layout).

def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float], causal: bool, top_left: bool,
              window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
              sinks: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor], dropout_p: float,
              dropout_rng: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    o, lse = _dense_outputs(q, k, v)
    q_run, scale_run, _ = _effective_q(q, scale)
    opts = _options(scale_run, causal, top_left, window_left, window_right, softcap, alibi_slopes, sinks, bias, mask)
    _run(_C.forward, q_run, k, v, o, lse, _set_dropout(opts, dropout_p, dropout_rng))
    return o, lse


_fwd = torch.library.custom_op("tileattn::fwd", _fwd_impl, mutates_args=(), device_types="cpu")


@_fwd.register_fake
def _(q, k, v, scale, causal, top_left, window_left, window_right, softcap, alibi_slopes, sinks, bias, mask,
      dropout_p, dropout_rng):
    B, Nq, Hq, _ = q.shape
    return q.new_empty((B, Nq, Hq, v.shape[3])), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("tileattn::bwd", mutates_args=(), device_types="cpu")
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, scale: Optional[float],
         causal: bool, top_left: bool, window_left: int, window_right: int, softcap: float,
         alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], bias: Optional[Tensor], mask: Optional[Tensor],
         dropout_p: float, dropout_rng: Optional[Tensor], want_dsinks: bool,
         want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    q_run, scale_run, dq_sign = _effective_q(q, scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    opts = _set_dropout(_options(scale_run, causal, top_left, window_left, window_right, softcap, alibi_slopes, sinks,
                                 bias, mask), dropout_p, dropout_rng)
    dsinks = q.new_empty((q.shape[2] if want_dsinks else 0,), dtype=torch.float32)
    dbias = q.new_empty(tuple(bias.shape) if want_dbias else (0, 0, 0, 0), dtype=torch.float32)
    if want_dsinks:
        opts.dsinks = _dl(dsinks)
    if want_dbias:
        opts.dbias = _dl(dbias)
    _run(_C.backward, q_run, k, v, o, lse, dout, dq, dk, dv, opts)
    dq = _chain_dq(dq, dq_sign)
    return (dq, dk, dv, dsinks.to(sinks.dtype) if want_dsinks else dsinks,
            dbias.to(bias.dtype) if want_dbias else dbias)


@_bwd.register_fake
def _(dout, q, k, v, o, lse, scale, causal, top_left, window_left, window_right, softcap, alibi_slopes, sinks,
      bias, mask, dropout_p, dropout_rng, want_dsinks, want_dbias):
    dsinks = q.new_empty((q.shape[2] if want_dsinks else 0,),
                         dtype=sinks.dtype if want_dsinks else torch.float32)
    dbias = q.new_empty(tuple(bias.shape) if want_dbias else (0, 0, 0, 0),
                        dtype=bias.dtype if want_dbias else torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks, dbias


def _fwd_setup(ctx, inputs, output):
    q, k, v, scale, causal, top_left, wl, wr, softcap, alibi, sinks, bias, mask, dropout_p, dropout_rng = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, alibi, sinks, bias, mask, dropout_rng)
    ctx.mark_non_differentiable(lse)  # a statistic, as FlashAttention's: the gradient flows through out
    ctx.args = (scale, causal, top_left, wl, wr, softcap)
    ctx.dropout_p = dropout_p
    ctx.want = (sinks is not None and ctx.needs_input_grad[10], bias is not None and ctx.needs_input_grad[11])


def _fwd_backward(ctx, dout, dlse):
    q, k, v, o, lse, alibi, sinks, bias, mask, dropout_rng = ctx.saved_tensors
    dq, dk, dv, dsinks, dbias = _bwd(dout.contiguous(), q, k, v, o, lse, *ctx.args, alibi, sinks, bias, mask,
                                     ctx.dropout_p, dropout_rng, *ctx.want)  # the forward's dropout, regenerated
    return (dq, dk, dv, None, None, None, None, None, None, None, dsinks if ctx.want[0] else None,
            dbias if ctx.want[1] else None, None, None, None)


torch.library.register_autograd("tileattn::fwd", _fwd_backward, setup_context=_fwd_setup)


def _bias_4d(bias: Optional[Tensor], B: int, H: int, Nq: int, Nk: int, name: str) -> Optional[Tensor]:
    """A bias or mask broadcastable to [B, H, Nq, Nk] as the kernels take it: 4 dimensions, the
    last two full (stride 0 where it broadcasts, no copy), the first two B or 1 and H or 1."""
    if bias is None:
        return None
    if bias.dim() > 4:
        raise _invalid(name, f"must have at most 4 dimensions, got {bias.dim()}")
    b = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)) if bias.dim() < 4 else bias
    try:
        return b.expand(b.shape[0], b.shape[1], Nq, Nk)
    except RuntimeError:
        raise _invalid(
            name, f"shape {tuple(bias.shape)} does not broadcast to [{B}, {H}, {Nq}, {Nk}]") from None


def attention(q: Tensor, k: Tensor, v: Tensor, *, softmax_scale: Optional[float] = None, causal: bool = False,
              top_left: bool = False, window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None, bias: Optional[Tensor] = None,
              mask: Optional[Tensor] = None, dropout_p: float = 0.0, dropout_rng: Optional[Tensor] = None,
              generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    """Attention in tileattn's (FlashAttention's) layout: q [B, Nq, Hq, D], k, v [B, Nk, Hkv, D(v)],
    Hq % Hkv == 0. Returns (out [B, Nq, Hq, Dv], lse [B, Hq, Nq] float32). out is differentiable
    in q, k, v, sinks and bias; lse is not (a statistic, as FlashAttention's softmax_lse).

    causal: bottom-right aligned (FlashAttention >= 2.1) unless top_left (SDPA's is_causal).
    window: (left, right), -1 unbounded. softcap > 0: Gemma-2's tanh cap. alibi_slopes [Hq] or
    [B, Hq]; sinks [Hq] (a logit per head joining every row's denominator); bias (additive, any
    float dtype) and mask (bool, True attends) broadcastable to [B, Hq, Nq, Nk].
    softmax_scale: any finite value (default 1/sqrt(D)).
    dropout_p: FlashAttention's attention dropout (P's entries dropped with probability
    dropout_p, in steps of 1/256, after the softmax, out scaled by 1 / (1 - that); lse is the
    undropped softmax's). Its decisions come from Philox 4x32-10 keyed by dropout_rng, an int64 tensor
    [seed, offset] (offset < 2**32), else by a seed drawn from ``generator`` (torch's default:
    ``torch.manual_seed`` reproduces it) with offset 0; the backward regenerates them. The
    same for every thread count (docs/python.md, "Dropout").
    """
    dropout_rng = _dropout_rng(dropout_p, dropout_rng, generator)
    B, Nq, Hq, _ = q.shape
    Nk = k.shape[1]
    # float32 before broadcasting: a [B, 1, 1, S] bf16 bias converts S values, not Nq x S (the
    # conversion is differentiable: dbias comes back in the bias's dtype).
    bias = _bias_4d(_float32(bias), B, Hq, Nq, Nk, "bias")
    mask = _bias_4d(mask, B, Hq, Nq, Nk, "mask")
    sinks, alibi_slopes = _float32(sinks), _float32(alibi_slopes)
    op = _fwd_impl if _eager(q, k, v, alibi_slopes, sinks, bias, mask) else _fwd
    return op(q, k, v, softmax_scale, causal, top_left, int(window[0]), int(window[1]), float(softcap), alibi_slopes,
              sinks, bias, mask, float(dropout_p), dropout_rng)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *, generator: Optional[torch.Generator] = None) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``'s call and semantics on tileattn:
    query [B, Hq, L, E] (or [Hq, L, E]), key [B, Hkv, S, E], value [B, Hkv, S, Ev]; attn_mask bool
    (True attends) or float (added), broadcastable to [B, Hq, L, S]; is_causal top-left aligned;
    enable_gqa lets Hkv divide Hq. A row that every mask entry hides gives 0 (SDPA's fused CPU
    kernel gives 0 too). dropout_p: applied as SDPA does (whatever the module's training flag),
    its seed drawn from torch's generator (attention()'s dropout). Returns [B, Hq, L, Ev] (a view
    of a [B, L, Hq, Ev] tensor)."""
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise _invalid("query", f"must have 3 or 4 dimensions, got {query.dim()}")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise _invalid("enable_gqa", f"key has {key.shape[1]} heads and query "
                                 f"{query.shape[1]}: pass enable_gqa=True for grouped-query attention")
    bias, mask = _split_mask(attn_mask)
    out, _ = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scale,
                       causal=is_causal, top_left=True, bias=bias, mask=mask, dropout_p=dropout_p, generator=generator)
    out = out.transpose(1, 2)
    return out.squeeze(0) if squeeze else out


# ----------------------------------------------------------------------------------------------
# Variable-length batches: q [total_q, Hq, D], k, v [total_k, Hkv, D(v)], cu_seqlens int32.

def _varlen_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, scale: Optional[float], causal: bool, window_left: int,
                     window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                     sinks: Optional[Tensor], dropout_p: float, dropout_rng: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_storage(name, t)
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    q_run, scale_run, _ = _effective_q(q, scale)
    opts = _options(scale_run, causal, False, window_left, window_right, softcap, alibi_slopes, sinks, None, None)
    _run(_C.forward_varlen, q_run, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, _set_dropout(opts, dropout_p, dropout_rng))
    return o, lse


_varlen_fwd = torch.library.custom_op("tileattn::varlen_fwd", _varlen_fwd_impl, mutates_args=(), device_types="cpu")


@_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right,
      softcap, alibi_slopes, sinks, dropout_p, dropout_rng):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2])), q.new_empty((q.shape[1], q.shape[0]),
                                                                          dtype=torch.float32)


@torch.library.custom_op("tileattn::varlen_bwd", mutates_args=(), device_types="cpu")
def _varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, scale: Optional[float], causal: bool,
                window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                sinks: Optional[Tensor], dropout_p: float, dropout_rng: Optional[Tensor],
                want_dsinks: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    q_run, scale_run, dq_sign = _effective_q(q, scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    opts = _set_dropout(_options(scale_run, causal, False, window_left, window_right, softcap, alibi_slopes, sinks,
                                 None, None), dropout_p, dropout_rng)
    dsinks = q.new_empty((q.shape[1] if want_dsinks else 0,), dtype=torch.float32)
    if want_dsinks:
        opts.dsinks = _dl(dsinks)
    _run(_C.backward_varlen, q_run, k, v, o, lse, dout, dq, dk, dv,
                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, opts)
    dq = _chain_dq(dq, dq_sign)
    return dq, dk, dv, dsinks.to(sinks.dtype) if want_dsinks else dsinks


@_varlen_bwd.register_fake
def _(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window_left,
      window_right, softcap, alibi_slopes, sinks, dropout_p, dropout_rng, want_dsinks):
    dsinks = q.new_empty((q.shape[1] if want_dsinks else 0,), dtype=sinks.dtype if want_dsinks else torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, softcap, alibi, sinks, dropout_p, dropout_rng = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, alibi, sinks, dropout_rng)
    ctx.mark_non_differentiable(lse)
    ctx.args = (max_q, max_k, scale, causal, wl, wr, softcap)
    ctx.dropout_p = dropout_p
    ctx.want_dsinks = sinks is not None and ctx.needs_input_grad[13]


def _varlen_backward(ctx, dout, dlse):
    q, k, v, o, lse, cu_q, cu_k, alibi, sinks, dropout_rng = ctx.saved_tensors
    dq, dk, dv, dsinks = _varlen_bwd(dout.contiguous(), q, k, v, o, lse, cu_q, cu_k, *ctx.args, alibi, sinks,
                                     ctx.dropout_p, dropout_rng, ctx.want_dsinks)
    return (dq, dk, dv) + (None,) * 10 + (dsinks if ctx.want_dsinks else None, None, None)


torch.library.register_autograd("tileattn::varlen_fwd", _varlen_backward, setup_context=_varlen_setup)


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, *, softmax_scale: Optional[float] = None,
                     causal: bool = False, window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None, dropout_p: float = 0.0,
                     dropout_rng: Optional[Tensor] = None,
                     generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    """FlashAttention's ``flash_attn_varlen_func``: packed q [total_q, Hq, D], k, v [total_k, Hkv, D(v)];
    sequence b owns rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (int32). Causal is bottom-right aligned
    per sequence. dropout_p, dropout_rng, generator: as attention()'s (each sequence its own
    stream). Returns (out [total_q, Hq, Dv], lse [Hq, total_q]). Differentiable in q, k, v, sinks."""
    dropout_rng = _dropout_rng(dropout_p, dropout_rng, generator)
    sinks, alibi_slopes = _float32(sinks), _float32(alibi_slopes)
    op = _varlen_fwd_impl if _eager(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks) else _varlen_fwd
    return op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), softmax_scale, causal,
              int(window[0]), int(window[1]), float(softcap), alibi_slopes, sinks, float(dropout_p), dropout_rng)


# ----------------------------------------------------------------------------------------------
# Inference over paged caches (vLLM's pools and block tables), writing them, merging states.

def _paged_fwd_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
                    scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
                    alibi_slopes: Optional[Tensor], sinks: Optional[Tensor], k_scale: Optional[Tensor],
                    v_scale: Optional[Tensor], kv_format: str, num_splits: int) -> Tuple[Tensor, Tensor]:
    _check_storage("q", q)
    B, Nq, Hq, _ = q.shape
    o = q.new_empty((B, Nq, Hq, v_cache.shape[3]))
    lse = q.new_empty((B, Hq, Nq), dtype=torch.float32)
    q_run, scale_run, _ = _effective_q(q, scale)
    opts = _options(scale_run, causal, False, window_left, window_right, softcap, alibi_slopes, sinks, None, None)
    opts.k_scale = _dl(_as_float(k_scale))
    opts.v_scale = _dl(_as_float(v_scale))
    opts.num_splits = num_splits
    _run(_C.forward_paged, q_run, k_cache, v_cache, block_table, cache_seqlens, o, lse, opts, kv_format)
    return o, lse


_paged_fwd = torch.library.custom_op("tileattn::paged_fwd", _paged_fwd_impl, mutates_args=(), device_types="cpu")


@_paged_fwd.register_fake
def _(q, k_cache, v_cache, block_table, cache_seqlens, scale, causal, window_left, window_right, softcap,
      alibi_slopes, sinks, k_scale, v_scale, kv_format, num_splits):
    B, Nq, Hq, _ = q.shape
    return q.new_empty((B, Nq, Hq, v_cache.shape[3])), q.new_empty((B, Hq, Nq), dtype=torch.float32)


def _scale_2d(s: Optional[Tensor]) -> Optional[Tensor]:
    if s is None or s.dim() == 2:
        return s
    return s.reshape(1, -1) if s.dim() == 1 else s.reshape(1, 1)


def forward_paged(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor, *,
                  softmax_scale: Optional[float] = None, causal: bool = False, window: Tuple[int, int] = (-1, -1),
                  softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                  k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None, kv_format: str = "",
                  num_splits: int = 0) -> Tuple[Tensor, Tensor]:
    """``flash_attn_with_kvcache`` over vLLM-style pools: q [B, Nq, Hq, D] (Nq = 1 decodes),
    k_cache / v_cache [num_pages, page_size, Hkv, D(v)] (any strides), block_table [B, max_pages]
    and cache_seqlens [B] (int32). 8-bit pools: int8 with k_scale / v_scale ([num_pages or 1,
    Hkv or 1], a 1-D [Hkv] or a scalar), or uint8 bytes of kv_format "fp8_e4m3" / "fp8_e5m2"
    (torch.float8 tensors are passed as their bytes). Returns (out, lse). Inference only."""
    if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        kv_format = kv_format or ("fp8_e4m3" if k_cache.dtype == torch.float8_e4m3fn else "fp8_e5m2")
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k_scale, v_scale = _scale_2d(k_scale), _scale_2d(v_scale)
    op = _paged_fwd_impl if _eager(q, k_cache, v_cache, block_table, cache_seqlens, alibi_slopes, sinks, k_scale,
                                   v_scale) else _paged_fwd
    return op(q, k_cache, v_cache, block_table, cache_seqlens, softmax_scale, causal, int(window[0]), int(window[1]),
              float(softcap), alibi_slopes, sinks, k_scale, v_scale, kv_format, int(num_splits))


class PagedDecode:
    """A decode loop's paged attention with its options made once (FlashInfer's plan/run split):
    ``run`` does one kernel call with no per-call Python work beyond handing the tensors over,
    and writes into ``out`` / ``lse`` when given, so a step allocates nothing. Semantics are
    ``forward_paged``'s; inference only (no autograd). Under ``torch.compile`` call
    ``forward_paged``, which the compiler traces.

        decode = ta.PagedDecode(softmax_scale=0.088, sinks=sinks)   # once
        for step in range(n):
            out, _ = decode.run(q, k_cache, v_cache, block_table, cache_seqlens, out=out)

    The options hold sinks, ALiBi slopes and 8-bit scales by reference (as float32), and the
    thread count is torch.get_num_threads() when the object is made.
    """

    def __init__(self, *, softmax_scale: Optional[float] = None, causal: bool = False,
                 window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                 sinks: Optional[Tensor] = None, k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None,
                 kv_format: str = "", num_splits: int = 0):
        scale_run, self._q_sign = _effective_scale(softmax_scale)
        self._options = _options(scale_run, causal, False, int(window[0]), int(window[1]), float(softcap),
                                 alibi_slopes, sinks, None, None)
        self._options.k_scale = _dl(_as_float(_scale_2d(k_scale)))
        self._options.v_scale = _dl(_as_float(_scale_2d(v_scale)))
        self._options.num_splits = int(num_splits)
        self._kv_format = kv_format

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor,
            out: Optional[Tensor] = None, lse: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Attention of q [B, Nq, Hq, D] to the pools through block_table and cache_seqlens, into
        out [B, Nq, Hq, Dv] (q's dtype; allocated when None) and lse [B, Hq, Nq] float32 (not
        written when None). Returns (out, lse)."""
        if out is None:
            out = q.new_empty(q.shape[:3] + v_cache.shape[3:])
        q = _q_to_run(q, self._q_sign)
        kv_format = self._kv_format
        if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            kv_format = kv_format or ("fp8_e4m3" if k_cache.dtype == torch.float8_e4m3fn else "fp8_e5m2")
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        _C.forward_paged(_to_dlpack(q), _to_dlpack(k_cache), _to_dlpack(v_cache), _to_dlpack(block_table),
                         _to_dlpack(cache_seqlens), _to_dlpack(out), _dl(lse), self._options, kv_format)
        return out, lse


def _write_kv_slots_impl(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                         k_scale: Optional[Tensor], v_scale: Optional[Tensor], kv_format: str) -> None:
    _run(_C.write_kv_slots, k_new, v_new, k_cache, v_cache, slot_mapping, k_scale, v_scale, kv_format)


_write_kv_slots = torch.library.custom_op("tileattn::write_kv_slots", _write_kv_slots_impl,
                                          mutates_args=("k_cache", "v_cache"), device_types="cpu")


def write_kv_slots(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                   k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None, kv_format: str = "") -> None:
    """vLLM's ``reshape_and_cache``: token i's rows of k_new, v_new [tokens, Hkv, D(v)] go to slot
    ``slot_mapping[i]`` (int64; -1 skips) of the pools, in place. int8 pools grow their per-(page,
    head) scales k_scale / v_scale [num_pages, Hkv] (float32, in place); fp8 pools take fixed ones."""
    if k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        kv_format = kv_format or ("fp8_e4m3" if k_cache.dtype == torch.float8_e4m3fn else "fp8_e5m2")
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    op = _write_kv_slots_impl if _eager(k_new, v_new, k_cache, v_cache, slot_mapping, k_scale,
                                        v_scale) else _write_kv_slots
    op(k_new, v_new, k_cache, v_cache, slot_mapping, k_scale, v_scale, kv_format)


def _merge_states_impl(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    o = torch.empty_like(o_a)
    lse = torch.empty_like(lse_a, dtype=torch.float32)
    _run(_C.merge_states, o_a, lse_a, o_b, lse_b, o, lse, torch.get_num_threads())
    return o, lse


_merge_states = torch.library.custom_op("tileattn::merge_states", _merge_states_impl, mutates_args=(),
                                        device_types="cpu")


@_merge_states.register_fake
def _(o_a, lse_a, o_b, lse_b):
    return torch.empty_like(o_a), torch.empty_like(lse_a, dtype=torch.float32)


def merge_states(o_a: Tensor, lse_a: Tensor, o_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """The attention over two disjoint key sets' union from each one's (out [B, N, H, Dv],
    lse [B, H, N]): FlashInfer's merge_state. Returns (out, lse)."""
    op = _merge_states_impl if _eager(o_a, lse_a, o_b, lse_b) else _merge_states
    return op(o_a, lse_a, o_b, lse_b)


# ----------------------------------------------------------------------------------------------
# Flexible attention over tileattn.flex's menu (masks ANDed, a relative-bias score_mod).

def _flex_spec(clauses: List[int], doc_q: Optional[Tensor], doc_kv: Optional[Tensor], layout: Optional[Tensor],
               table: Optional[Tensor], max_distance: int, block_q: int, block_kv: int) -> "_C.FlexSpec":
    s = _C.FlexSpec()
    s.clauses = list(clauses)
    s.doc_q, s.doc_kv, s.layout = _dl(doc_q), _dl(doc_kv), _dl(layout)
    s.table = None if table is None else _dl(_as_float(table).reshape(-1))
    s.max_distance, s.block_q, s.block_kv = max_distance, block_q, block_kv
    return s


def _flex_fwd_impl(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float], softcap: float,
                   alibi_slopes: Optional[Tensor], clauses: List[int], doc_q: Optional[Tensor],
                   doc_kv: Optional[Tensor], layout: Optional[Tensor], table: Optional[Tensor], max_distance: int,
                   block_q: int, block_kv: int) -> Tuple[Tensor, Tensor]:
    o, lse = _dense_outputs(q, k, v)
    q_run, scale_run, _ = _effective_q(q, scale)
    _run(_C.forward_flex, q_run, k, v, o, lse,
         _options(scale_run, False, False, -1, -1, softcap, alibi_slopes, None, None, None),
         _flex_spec(clauses, doc_q, doc_kv, layout, table, max_distance, block_q, block_kv))
    return o, lse


_flex_fwd = torch.library.custom_op("tileattn::flex_fwd", _flex_fwd_impl, mutates_args=(), device_types="cpu")


@_flex_fwd.register_fake
def _(q, k, v, scale, softcap, alibi_slopes, clauses, doc_q, doc_kv, layout, table, max_distance, block_q,
      block_kv):
    B, Nq, Hq, _ = q.shape
    return q.new_empty((B, Nq, Hq, v.shape[3])), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("tileattn::flex_bwd", mutates_args=(), device_types="cpu")
def _flex_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, scale: Optional[float],
              softcap: float, alibi_slopes: Optional[Tensor], clauses: List[int], doc_q: Optional[Tensor],
              doc_kv: Optional[Tensor], layout: Optional[Tensor], table: Optional[Tensor], max_distance: int,
              block_q: int, block_kv: int) -> Tuple[Tensor, Tensor, Tensor]:
    q_run, scale_run, dq_sign = _effective_q(q, scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _run(_C.backward_flex, q_run, k, v, o, lse, dout, dq, dk, dv,
                     _options(scale_run, False, False, -1, -1, softcap, alibi_slopes, None, None, None),
                     _flex_spec(clauses, doc_q, doc_kv, layout, table, max_distance, block_q, block_kv))
    dq = _chain_dq(dq, dq_sign)
    return dq, dk, dv


@_flex_bwd.register_fake
def _(dout, q, k, v, o, lse, scale, softcap, alibi_slopes, clauses, doc_q, doc_kv, layout, table, max_distance,
      block_q, block_kv):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flex_setup(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = inputs[3:]
    ctx.mark_non_differentiable(lse)


def _flex_backward(ctx, dout, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _flex_bwd(dout.contiguous(), q, k, v, o, lse, *ctx.args)
    return (dq, dk, dv) + (None,) * 11


torch.library.register_autograd("tileattn::flex_fwd", _flex_backward, setup_context=_flex_setup)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Sequence] = None,
                   score_mod: Optional[_flex.RelativeBias] = None, block_size: Tuple[int, int] = (128, 128),
                   softmax_scale: Optional[float] = None, softcap: float = 0.0,
                   alibi_slopes: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """FlexAttention over ``tileattn.flex``'s menu, forward and backward (PyTorch's CPU
    FlexAttention has no backward): q [B, Nq, Hq, D], k, v [B, Nk, Hkv, D(v)] (tileattn's
    layout); ``mask`` a list of clauses (``flex.Causal()``, ``flex.Document(ids)``,
    ``flex.SlidingWindow(...)``, ``flex.PrefixLM(n)``, ``flex.GlobalWindow(...)``,
    ``flex.DilatedWindow(...)``, ``flex.BlockSparse(layout, block)``) ANDed; ``score_mod`` None
    or ``flex.RelativeBias(table, max_distance)`` (the table is not trained). ``block_size``:
    the block mask's (query, key) block. Returns (out, lse); out is differentiable in q, k, v."""
    cl, doc_q, doc_kv, layout = _flex.clauses(mask)
    table, max_distance = (None, 0) if score_mod is None else (score_mod.table, int(score_mod.max_distance))
    if score_mod is not None and not isinstance(score_mod, _flex.RelativeBias):
        raise _invalid("score_mod", f"{score_mod!r} is not tileattn.flex.RelativeBias")
    alibi_slopes, table = _float32(alibi_slopes), _float32(table)
    op = _flex_fwd_impl if _eager(q, k, v, alibi_slopes, doc_q, doc_kv, layout, table) else _flex_fwd
    return op(q, k, v, softmax_scale, float(softcap), alibi_slopes, list(cl), doc_q, doc_kv, layout, table,
              max_distance, int(block_size[0]), int(block_size[1]))
