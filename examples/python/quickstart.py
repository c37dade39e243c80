"""tileattn from PyTorch in one page: the SDPA drop-in, tileattn's own options with their
gradients, a variable-length batch, and a decode step over a paged cache written the way vLLM
writes it. Each step checks itself against PyTorch or a direct computation.

    pip install ./python torch        # from the repository's root
    python examples/python/quickstart.py
"""
import torch
import torch.nn.functional as F

import tileattn
import tileattn.torch as ta

torch.manual_seed(0)
print("tileattn runs", tileattn.active_isa(), "on", torch.get_num_threads(), "threads")

# 1. SDPA's call: [B, H, L, E], causal (top-left, as SDPA), grouped-query attention.
q = torch.randn(2, 8, 100, 64, requires_grad=True)
k = torch.randn(2, 2, 100, 64, requires_grad=True)
v = torch.randn(2, 2, 100, 64, requires_grad=True)
out = ta.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
assert (out - want).abs().max() < 1e-5
out.sum().backward()  # gradients of q, k, v through tileattn's backward
print("1. SDPA drop-in: max |tileattn - torch| =", f"{(out - want).abs().max():.1e}")

# 2. tileattn's own options in [B, L, H, E] (FlashAttention's layout): a sliding window, Gemma-2's
#    softcap and learned attention sinks (GPT-OSS), whose gradient comes back too.
sinks = torch.zeros(8, requires_grad=True)
o, lse = ta.attention(q.detach().transpose(1, 2), k.detach().transpose(1, 2), v.detach().transpose(1, 2),
                      causal=True, window=(31, 0), softcap=30.0, sinks=sinks)
o.square().mean().backward()
assert sinks.grad is not None and torch.isfinite(sinks.grad).all()
print("2. window + softcap + sinks: out", tuple(o.shape), "lse", tuple(lse.shape), "dsinks", sinks.grad[:3])

# 3. Three sequences packed back to back (FlashAttention's varlen call).
lens = [5, 40, 17]
cu = torch.tensor([0, 5, 45, 62], dtype=torch.int32)
qp, kp, vp = (torch.randn(62, h, 32) for h in (4, 2, 2))
op, _ = ta.attention_varlen(qp, kp, vp, cu, cu, max(lens), max(lens), causal=True)
s = slice(5, 45)  # the second sequence alone
alone, _ = ta.attention(qp[None, s], kp[None, s], vp[None, s], causal=True)
assert torch.allclose(op[s], alone[0], atol=1e-6)
print("3. varlen: the packed batch gives each sequence its own attention")

# 4. Decode: K/V pools of 16-token pages [pages, 16, Hkv, E], written by slot as vLLM does, read
#    through a block table (sequence 0 in pages 3 and 1: slots 48.. and 16..).
k_cache, v_cache = torch.zeros(8, 16, 2, 64), torch.zeros(8, 16, 2, 64)
k_new, v_new = torch.randn(20, 2, 64), torch.randn(20, 2, 64)
slots = torch.tensor([48 + i for i in range(16)] + [16 + i for i in range(4)], dtype=torch.int64)
ta.write_kv_slots(k_new, v_new, k_cache, v_cache, slots)
q1 = torch.randn(1, 1, 8, 64)  # one new token, 8 query heads
o1, _ = ta.forward_paged(q1, k_cache, v_cache, torch.tensor([[3, 1]], dtype=torch.int32),
                         torch.tensor([20], dtype=torch.int32))
want1 = F.scaled_dot_product_attention(q1.transpose(1, 2), k_new.transpose(0, 1)[None], v_new.transpose(0, 1)[None],
                                       enable_gqa=True).transpose(1, 2)
assert (o1 - want1).abs().max() < 1e-5
print("4. paged decode matches attention over the 20 tokens written")
print("quickstart: all checks passed")
