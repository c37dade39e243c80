"""Attention dropout through tileattn.torch and the Hugging Face integration: every kept /
dropped decision against a Philox 4x32-10 written here with NumPy from the published
algorithm (not the kernels' code), the keep rate within its binomial bound, O and the
gradients against the float64 definition with the same mask, the seed from torch's
generator, thread-count independence, torch.compile, the errors, and training a Hugging
Face model with attention dropout."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tileattn  # noqa: E402
import tileattn.torch as ta  # noqa: E402

import reference  # noqa: E402

torch.set_num_threads(2)

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK32 = np.uint64(0xFFFFFFFF)


def philox(c0, c1, c2, c3, k0, k1):
    """Philox 4x32-10 over arrays of counters (uint64 arrays holding 32-bit words)."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in (c0, c1, c2, c3)]
    for r in range(10):
        rk0 = np.uint64((k0 + r * W0) & 0xFFFFFFFF)
        rk1 = np.uint64((k1 + r * W1) & 0xFFFFFFFF)
        a = c[0] * np.uint64(M0)
        b = c[2] * np.uint64(M1)
        c = [((b >> np.uint64(32)) ^ c[1] ^ rk0) & MASK32, b & MASK32, ((a >> np.uint64(32)) ^ c[3] ^ rk1) & MASK32,
             a & MASK32]
    return c


def test_philox_known_answers():
    # Random123's kat_vectors, philox4x32 10.
    out = philox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0)
    assert [int(x) for x in out] == [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    out = philox(0, 0, 0, 0, 0, 0)
    assert [int(x) for x in out] == [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]


def threshold(p):
    """A key is dropped iff its byte is below min(round(256 p), 255); p' = threshold / 256."""
    return min(math.floor(p * 256 + 0.5), 255)


def keeps(p, seed, offset, sequence, heads, head, nq, nk):
    """Boolean [nq, nk]: dropout's decisions for (sequence, head), by the stream's definition:
    with m = j % 128, key j's byte is byte m % 4 of word 2 (m // 64) + (m // 32) % 2 of the call
    with counter (8 (j // 128) + (m // 4) % 8, query, sequence * heads + head, offset) under key
    (seed lo, seed hi)."""
    i = np.arange(nq, dtype=np.uint64)[:, None]
    j = np.arange(nk, dtype=np.uint64)[None, :]
    m = j % np.uint64(128)
    c0 = (j // np.uint64(128)) * np.uint64(8) + (m // np.uint64(4)) % np.uint64(8)
    c0, c1 = np.broadcast_arrays(c0, i)
    words = philox(c0, c1, np.uint64(sequence * heads + head), np.uint64(offset), seed & 0xFFFFFFFF, seed >> 32)
    w = (np.uint64(2) * (m // np.uint64(64)) + (m // np.uint64(32)) % np.uint64(2)).astype(np.int64)
    byte = m % np.uint64(4)
    x = np.choose(np.broadcast_to(w, c0.shape), words)
    u = (x >> (np.uint64(8) * byte)) & np.uint64(0xFF)
    return u >= np.uint64(threshold(p))


def identity_values(B, nq, nk, hq, hkv, dtype, seed=0):
    """q, k and V = I per K/V head: out[b, i, h, j] is nonzero exactly where key j is kept."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nq, hq, 16, generator=g).to(dtype)
    k = torch.randn(B, nk, hkv, 16, generator=g).to(dtype)
    v = torch.eye(nk, dtype=dtype).reshape(1, nk, 1, nk).expand(B, nk, hkv, nk).contiguous()
    return q, k, v


def decisions(out):
    return (out != 0).numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_every_decision_is_the_streams(dtype, p):
    B, nq, nk, hq, hkv = 2, 33, 150, 4, 2
    q, k, v = identity_values(B, nq, nk, hq, hkv, dtype)
    seed, offset = 0x1234567890ABCDEF, 3
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    out, _ = ta.attention(q, k, v, softmax_scale=0.05, dropout_p=p, dropout_rng=rng)
    for b in range(B):
        for h in range(hq):
            want = keeps(p, seed, offset, b, hq, h, nq, nk)
            np.testing.assert_array_equal(decisions(out[b, :, h, :]), want, err_msg=f"b {b} h {h}")


def test_keep_rate_within_its_binomial_bound():
    for p in (0.1, 0.3, 0.5):
        q, k, v = identity_values(2, 64, 200, 4, 4, torch.float32, seed=1)
        out, _ = ta.attention(q, k, v, softmax_scale=0.05, dropout_p=p)
        n = out.numel()
        rate = (out != 0).sum().item() / n
        keep = 1 - threshold(p) / 256
        assert abs(rate - keep) <= 5 * math.sqrt(keep * (1 - keep) / n), (p, rate)


def mask_of(q, k, nk, p, rng, causal=False, top_left=False):
    """The [B, H, Nq, Nk] dropout factors (0 or 1 / (1 - p'), p' = threshold / 256) a call with
    rng uses, read off a call with V = I (the decisions do not depend on V)."""
    B, nq, hq, _ = q.shape
    eye = torch.eye(nk, dtype=q.dtype).reshape(1, nk, 1, nk).expand(B, nk, k.shape[2], nk).contiguous()
    out, _ = ta.attention(q, k, eye, softmax_scale=1e-3, causal=causal, top_left=top_left, dropout_p=p,
                          dropout_rng=rng)
    return (out != 0).permute(0, 2, 1, 3).double() / (1 - threshold(p) / 256)


def reference_with_mask(q, k, v, z, scale=None, causal=False):
    """O in float64 with dropout factors z applied to P (the definition)."""
    B, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qd, kd, vd = q.double(), k.double().repeat_interleave(g, 2), v.double().repeat_interleave(g, 2)
    scale = 1 / math.sqrt(d) if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    vis = reference.positions_visible(nq, nk, causal, False, (-1, -1))
    s = s.masked_fill(~vis, float("-inf"))
    pr = torch.softmax(s, dim=-1) * z
    return torch.einsum("bhqk,bkhd->bqhd", pr, vd)


@pytest.mark.parametrize("causal", [False, True])
def test_out_and_gradients_match_the_definition_with_the_same_mask(causal):
    B, nq, nk, hq, hkv, d = 2, 17, 127, 4, 2, 32
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, nq, hq, d, generator=g)
    k = torch.randn(B, nk, hkv, d, generator=g)
    v = torch.randn(B, nk, hkv, d, generator=g)
    p, rng = 0.3, torch.tensor([77, 1], dtype=torch.int64)
    z = mask_of(q, k, nk, p, rng, causal=causal)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, _ = ta.attention(qg, kg, vg, causal=causal, dropout_p=p, dropout_rng=rng)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    want = reference_with_mask(qd, kd, vd, z, causal=causal)
    assert (out.double() - want).abs().max().item() < 2e-5
    dout = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (qg, kg, vg), dout)
    wants = torch.autograd.grad(want, (qd, kd, vd), dout.double())
    for name, a, b in zip("qkv", got, wants):
        scale = b.abs().max().item()
        assert (a.double() - b).abs().max().item() < 2e-5 * max(scale, 1.0), name


def test_seed_comes_from_torchs_generator_and_threads_change_nothing():
    q, k, v = (torch.randn(2, 4, 50, 32) for _ in range(3))
    torch.manual_seed(0)
    a = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    b = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    torch.set_num_threads(2)
    c = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)  # a new seed
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    gen = torch.Generator().manual_seed(4)
    d = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.2, generator=gen)
    gen.manual_seed(4)
    e = ta.scaled_dot_product_attention(q, k, v, dropout_p=0.2, generator=gen)
    assert torch.equal(d, e)
    # dropout_p = 0 is the call without dropout.
    assert torch.equal(ta.scaled_dot_product_attention(q, k, v, dropout_p=0.0), ta.scaled_dot_product_attention(q, k, v))


def test_varlen_dropout_matches_the_per_sequence_streams():
    cu = torch.tensor([0, 20, 20, 70], dtype=torch.int32)
    q, k = torch.randn(70, 2, 16), torch.randn(70, 1, 16)
    v = torch.eye(70).reshape(70, 1, 70)  # packed V = I: column j is packed key j
    seed = 99
    out, _ = ta.attention_varlen(q, k, v, cu, cu, 50, 50, softmax_scale=0.05, dropout_p=0.4,
                                 dropout_rng=torch.tensor([seed, 0]))
    for s in range(3):
        a, b = int(cu[s]), int(cu[s + 1])
        for h in range(2):
            want = keeps(0.4, seed, 0, s, 2, h, b - a, b - a)
            np.testing.assert_array_equal(decisions(out[a:b, h, a:b]), want, err_msg=f"sequence {s} head {h}")


def test_compile_traces_dropout():
    q, k, v = (torch.randn(1, 40, 2, 16) for _ in range(3))
    rng = torch.tensor([5, 0], dtype=torch.int64)

    def f(q, k, v):
        return ta.attention(q, k, v, causal=True, dropout_p=0.25, dropout_rng=rng)[0]

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v), rtol=0, atol=0)

    def g(q, k, v):  # the seed drawn inside the graph
        return ta.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               dropout_p=0.25)

    torch.manual_seed(6)
    out = torch.compile(g, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.manual_seed(6)
    torch.testing.assert_close(out, g(q, k, v), rtol=0, atol=0)  # the same draw from torch's generator
    assert not torch.equal(out, g(q, k, v))


def test_bad_dropout_arguments_name_themselves():
    q = torch.randn(1, 4, 2, 8)
    for p in (-0.1, 1.0, float("nan")):
        with pytest.raises(tileattn.InvalidArgument, match="dropout_p"):
            ta.attention(q, q, q, dropout_p=p)
    with pytest.raises(tileattn.InvalidArgument, match="dropout_rng"):
        ta.attention(q, q, q, dropout_p=0.1, dropout_rng=torch.tensor([1.0, 2.0]))
    with pytest.raises(tileattn.InvalidArgument, match="dropout_rng"):
        ta.attention(q, q, q, dropout_p=0.1, dropout_rng=torch.tensor([1, 2**32]))
    with pytest.raises(tileattn.InvalidArgument, match="dropout_rng"):  # the op itself, called directly
        torch.ops.tileattn.fwd(q, q, q, None, False, False, -1, -1, 0.0, None, None, None, None, 0.1, None)


def test_hugging_face_trains_with_attention_dropout():
    transformers = pytest.importorskip("transformers")
    import tileattn.transformers as tt

    name = tt.register()
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, attention_dropout=0.2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=name)
    ids = torch.randint(3, 100, (2, 24))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.train()
    torch.manual_seed(1)
    l1, g1 = loss_and_grads()
    torch.manual_seed(1)
    l2, g2 = loss_and_grads()
    torch.manual_seed(2)
    l3, _ = loss_and_grads()
    assert l1 == l2 and all(torch.equal(a, b) for a, b in zip(g1, g2))  # the seed from torch's generator
    assert l1 != l3  # a new mask each step
    assert all(torch.isfinite(g).all() for g in g1)
    model.eval()
    with torch.no_grad():
        a = model(ids).logits
        b = model(ids).logits
    assert torch.equal(a, b)  # no dropout outside training
