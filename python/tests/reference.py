"""The tests' reference attention: the definition, written out with PyTorch ops in any dtype
(float64 for the truth, the inputs' dtype for the "naive same-precision implementation" of
FlashAttention's accuracy rule), differentiable by autograd. Layout [B, N, H, D]."""
import math

import torch


def positions_visible(nq, nk, causal, top_left, window):
    """Boolean [nq, nk]: which keys each query sees under causal / window (tileattn's semantics)."""
    offset = 0 if top_left else nk - nq
    i = torch.arange(nq).unsqueeze(1) + offset
    j = torch.arange(nk).unsqueeze(0)
    left, right = window
    if causal:
        right = 0
    ok = torch.ones(nq, nk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def attention(q, k, v, scale=None, causal=False, top_left=False, window=(-1, -1), softcap=0.0, alibi=None,
              sinks=None, bias=None, mask=None, dtype=torch.float64):
    """O and LSE of q [B, Nq, Hq, D], k, v [B, Nk, Hkv, D(v)] computed in `dtype`. Rows that see
    no key give O = 0 (and LSE = -inf, or the sink's logit)."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        offset = 0 if top_left else nk - nq
        dist = (torch.arange(nq).unsqueeze(1) + offset - torch.arange(nk).unsqueeze(0)).abs().to(dtype)
        slopes = alibi.to(dtype).reshape(-1, hq, 1, 1) if alibi.dim() == 2 else alibi.to(dtype).reshape(1, hq, 1, 1)
        s = s - slopes * dist
    visible = positions_visible(nq, nk, causal, top_left, window).expand(B, hq, nq, nk)
    if mask is not None:
        visible = visible & mask.expand(B, hq, nq, nk)
    if bias is not None:
        s = s + bias.to(dtype)
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to(dtype).reshape(1, hq, 1, 1).expand(B, hq, nq, 1)
        s = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # -inf where a row has no key and no sink
    seen = torch.isfinite(lse).unsqueeze(-1)
    p = torch.exp(s - torch.where(seen, lse.unsqueeze(-1), torch.zeros_like(lse).unsqueeze(-1)))
    p = torch.where(seen, p, torch.zeros_like(p))
    if sinks is not None:
        p = p[..., :nk]
    o = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return o, lse
