"""tileattn.torch against PyTorch itself: the SDPA drop-in against
torch.nn.functional.scaled_dot_product_attention in float64 over a table of cases, tileattn's
own options against the float64 definition (reference.py), gradients (autograd in float64, and
gradcheck), varlen, paged decode, merge_states, torch.compile, and the errors.

Accuracy is FlashAttention's rule: the error against float64 is at most twice (three times for
gradients) that of a naive implementation in the same precision, plus a small floor."""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tileattn  # noqa: E402
import tileattn.torch as ta  # noqa: E402

import reference  # noqa: E402

torch.set_num_threads(2)


def err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def randn(*shape, dtype=torch.float32, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 1000)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# ------------------------------------------------------------------------------------------------
# The SDPA drop-in: (B, Hq, Hkv, L, S, E, Ev) x causal x mask x scale, fp32 against SDPA in float64.

SHAPES = [
    (1, 1, 1, 1, 1, 1, 1),
    (2, 4, 4, 17, 17, 64, 64),
    (1, 8, 2, 127, 33, 32, 32),    # GQA, more queries than keys
    (2, 4, 1, 33, 127, 17, 17),    # MQA, odd head dim
    (1, 2, 2, 65, 200, 128, 64),   # Ev != E
]
MASKS = ["none", "bool", "padding", "float", "float2d", "empty_rows"]


def make_mask(kind, B, H, L, S, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "bool":
        return torch.rand(B, H, L, S, generator=g) > 0.3
    if kind == "padding":  # [B, 1, 1, S]: the last keys of each batch are padding
        m = torch.ones(B, 1, 1, S, dtype=torch.bool)
        m[0, ..., S - S // 3:] = False
        return m
    if kind == "float":
        return torch.randn(B, 1, L, S, generator=g, dtype=torch.float64).float()
    if kind == "float2d":
        return torch.randn(L, S, generator=g, dtype=torch.float64).float()
    if kind == "empty_rows":  # some query rows see no key at all
        m = torch.rand(B, H, L, S, generator=g) > 0.5
        m[..., ::3, :] = False
        return m
    raise ValueError(kind)


def sdpa_inputs(B, Hq, Hkv, L, S, E, Ev, seed, dtype=torch.float32):
    return (randn(B, Hq, L, E, dtype=dtype, seed=seed), randn(B, Hkv, S, E, dtype=dtype, seed=seed + 1),
            randn(B, Hkv, S, Ev, dtype=dtype, seed=seed + 2))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mask_kind", MASKS)
def test_sdpa_forward_matches_sdpa_in_float64(shape, causal, mask_kind):
    B, Hq, Hkv, L, S, E, Ev = shape
    q, k, v = sdpa_inputs(*shape, seed=sum(shape))
    mask = make_mask(mask_kind, B, Hq, L, S, seed=L * S)
    gqa = Hq != Hkv
    kw = dict(attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    if causal and mask is not None:  # SDPA takes one or the other: fold causal into the mask
        tri = torch.ones(L, S, dtype=torch.bool).tril()
        kw = dict(attn_mask=(mask & tri) if mask.dtype == torch.bool else mask.masked_fill(~tri, -math.inf),
                  enable_gqa=gqa)
    m64 = kw.get("attn_mask")
    kw64 = dict(kw, attn_mask=m64.double() if m64 is not None and m64.dtype != torch.bool else m64)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw64)
    naive = F.scaled_dot_product_attention(q, k, v, **kw)
    got = ta.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    assert got.shape == want.shape
    # Rows that see no key: 0 from tileattn. SDPA in float64 agrees (its safe softmax).
    assert not torch.isnan(got).any()
    assert err(got, want) <= 2 * err(naive, want) + 2e-6, (err(got, want), err(naive, want))


@pytest.mark.parametrize("scale", [0.3, 0.0, -0.5, 2.0])
def test_sdpa_takes_any_finite_scale(scale):
    """PyTorch accepts zero and negative scales; tileattn's kernels take scale > 0, and the op
    runs -q at |scale| (scale 0: q = 0), exactly the same scores. Against the definition: torch's
    own SDPA gives NaN for scale 0 (its fused CPU kernel)."""
    q0, k0, v0 = (t.transpose(1, 2) for t in sdpa_inputs(2, 4, 2, 19, 23, 32, 32, seed=7))
    dout = randn(2, 19, 4, 32, seed=3)

    def run(fn, dtype):
        ins = [t.detach().to(dtype).requires_grad_(True) for t in (q0, k0, v0)]
        out = fn(*ins)
        out.backward(dout.to(dtype))
        return [out.detach()] + [t.grad for t in ins]

    def ref(dtype):
        return lambda q, k, v: reference.attention(q, k, v, scale=scale, causal=True, top_left=True, dtype=dtype)[0]

    got = run(lambda q, k, v: ta.attention(q, k, v, softmax_scale=scale, causal=True, top_left=True)[0],
              torch.float32)
    want, naive = run(ref(torch.float64), torch.float64), run(ref(torch.float32), torch.float32)
    for i, (g, n, w) in enumerate(zip(got, naive, want)):
        assert err(g, w) <= (2 if i == 0 else 3) * err(n, w) + 1e-6, (i, err(g, w), err(n, w))


def test_sdpa_non_contiguous_inputs_are_read_in_place():
    base = randn(2, 40, 6, 3 * 32, seed=11)              # [B, L, H, 3E]: a fused QKV projection
    q = base[..., :32].transpose(1, 2)                   # [B, H, L, E] views, strided twice
    k = base[..., 32:64].transpose(1, 2)[:, :, ::2]      # every other key
    v = base[..., 64:].transpose(1, 2)[:, :, ::2]
    assert not q.is_contiguous() and not k.is_contiguous()
    got = ta.scaled_dot_product_attention(q, k, v)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert err(got, want) < 2e-6


def test_sdpa_three_dimensional_inputs():
    q, k, v = (randn(4, 9, 16, seed=s) for s in (1, 2, 3))
    assert err(ta.scaled_dot_product_attention(q, k, v),
               F.scaled_dot_product_attention(q.double(), k.double(), v.double())) < 2e-6


@pytest.mark.parametrize("shape", SHAPES[1:4], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "empty_rows"])
def test_sdpa_gradients_match_sdpa_in_float64(shape, mask_kind):
    B, Hq, Hkv, L, S, E, Ev = shape
    q, k, v = sdpa_inputs(*shape, seed=3 * sum(shape))
    mask = make_mask(mask_kind, B, Hq, L, S, seed=L + S)
    gqa = Hq != Hkv
    dout = randn(B, Hq, L, Ev, seed=99)

    def grads(fn, dtype):
        ins = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        m = mask if mask is None or mask.dtype == torch.bool else mask.to(dtype)
        fn(*ins, attn_mask=m, enable_gqa=gqa).backward(dout.to(dtype))
        return [t.grad for t in ins]

    want = grads(F.scaled_dot_product_attention, torch.float64)
    naive = grads(F.scaled_dot_product_attention, torch.float32)
    got = grads(ta.scaled_dot_product_attention, torch.float32)
    for name, g, n, w in zip("qkv", got, naive, want):
        assert err(g, w) <= 3 * err(n, w) + 1e-5, (name, err(g, w), err(n, w))


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_on_float32():
    # The kernels take no float64 (they accumulate in float32), so gradcheck runs in float32
    # with a step and tolerances sized for it.
    q, k, v = (randn(1, 5, 2, 8, seed=s).requires_grad_(True) for s in (1, 2, 3))
    sinks = randn(2, seed=4).requires_grad_(True)

    def fn(q, k, v, sinks):
        return ta.attention(q, k, v, causal=True, sinks=sinks)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), eps=1e-2, atol=2e-3, rtol=2e-2, nondet_tol=0.0)


# ------------------------------------------------------------------------------------------------
# tileattn's own options against the float64 definition.

OPTION_CASES = {
    "bottom_right_causal": dict(causal=True),
    "top_left_causal": dict(causal=True, top_left=True),
    "window": dict(window=(5, 3)),
    "causal_window": dict(causal=True, window=(7, -1)),
    "softcap": dict(softcap=2.5),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "bias": dict(bias=True),
    "everything": dict(causal=True, window=(9, 0), softcap=4.0, alibi=True, sinks=True, bias=True),
}


def option_inputs(opts, Hq, Nq, Nk, seed):
    alibi = torch.rand(Hq, generator=torch.Generator().manual_seed(seed)) * 0.5 if opts.get("alibi") else None
    sinks = randn(Hq, seed=seed + 1) if opts.get("sinks") else None
    bias = randn(1, Hq, Nq, Nk, seed=seed + 2) if opts.get("bias") else None
    rest = {k: v for k, v in opts.items() if k not in ("alibi", "sinks", "bias")}
    return alibi, sinks, bias, rest


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_options_forward_and_gradients_against_float64(case, dtype):
    B, Nq, Nk, Hq, Hkv, D = 2, 37, 53, 4, 2, 32
    alibi, sinks, bias, rest = option_inputs(OPTION_CASES[case], Hq, Nq, Nk, seed=len(case))
    q0, k0, v0 = randn(B, Nq, Hq, D, seed=1), randn(B, Nk, Hkv, D, seed=2), randn(B, Nk, Hkv, D, seed=3)
    dout = randn(B, Nq, Hq, D, seed=4)

    def run(fn, run_dtype, **extra):
        ins = [t.detach().to(run_dtype, copy=True).requires_grad_(True) for t in (q0, k0, v0)]
        s = None if sinks is None else sinks.detach().to(run_dtype, copy=True).requires_grad_(True)
        b = None if bias is None else bias.detach().to(run_dtype, copy=True).requires_grad_(True)
        o, _ = fn(*ins, alibi=alibi, sinks=s, bias=b, **rest, **extra)
        o.backward(dout.to(run_dtype))
        grads = [t.grad for t in ins] + ([s.grad] if s is not None else []) + ([b.grad] if b is not None else [])
        return o.detach(), grads

    def ours(q, k, v, alibi, sinks, bias, **kw):
        return ta.attention(q, k, v, alibi_slopes=alibi, sinks=sinks, bias=bias, **kw)

    def ref(q, k, v, alibi, sinks, bias, dtype, **kw):
        return reference.attention(q, k, v, alibi=alibi, sinks=sinks, bias=bias, dtype=dtype, **kw)

    want_o, want_g = run(ref, torch.float64, dtype=torch.float64)
    naive_o, naive_g = run(ref, dtype, dtype=dtype)
    got_o, got_g = run(ours, dtype)
    floor = 1e-6 if dtype == torch.float32 else 1e-3
    assert got_o.dtype == dtype
    assert err(got_o, want_o) <= 2 * err(naive_o, want_o) + floor, (err(got_o, want_o), err(naive_o, want_o))
    for i, (g, n, w) in enumerate(zip(got_g, naive_g, want_g)):
        assert g.dtype == dtype
        assert err(g, w) <= 3 * err(n, w) + 10 * floor, (i, err(g, w), err(n, w))


def test_lse_matches_the_definition():
    q, k, v = randn(1, 9, 2, 16, seed=1), randn(1, 12, 2, 16, seed=2), randn(1, 12, 2, 16, seed=3)
    _, lse = ta.attention(q, k, v, causal=True)
    _, want = reference.attention(q, k, v, causal=True)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 9)
    assert err(lse, want) < 1e-5


# ------------------------------------------------------------------------------------------------
# Varlen, paged decode, merge_states.

def test_varlen_forward_and_backward_match_each_sequence():
    lens_q, lens_k = [5, 0, 17, 1], [9, 4, 17, 30]
    Hq, Hkv, D = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = randn(int(cu_q[-1]), Hq, D, seed=1).requires_grad_(True)
    k = randn(int(cu_k[-1]), Hkv, D, seed=2).requires_grad_(True)
    v = randn(int(cu_k[-1]), Hkv, D, seed=3).requires_grad_(True)
    o, lse = ta.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    dout = randn(*o.shape, seed=4)
    o.backward(dout)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        q64, k64, v64 = (t.detach()[s].double().unsqueeze(0).requires_grad_(True) for t, s in ((q, qs), (k, ks), (v, ks)))
        want, want_lse = reference.attention(q64, k64, v64, causal=True)
        assert err(o[qs], want[0]) < 2e-6
        if lens_q[b]:
            assert err(lse[:, qs], want_lse[0]) < 1e-5
            want.backward(dout[qs].double().unsqueeze(0))
            assert err(q.grad[qs], q64.grad[0]) < 1e-5
            assert err(k.grad[ks], k64.grad[0]) < 1e-5
            assert err(v.grad[ks], v64.grad[0]) < 1e-5


def paged_cache(B, lens, Hkv, D, page_size, seed, dtype=torch.float32):
    """Pools [num_pages, page_size, Hkv, D] with each sequence's keys in shuffled pages."""
    pages_per = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages_per) + 3
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    table = torch.zeros(B, max(pages_per), dtype=torch.int32)
    k_dense = [randn(n, Hkv, D, seed=seed + 10 * b) for b, n in enumerate(lens)]
    v_dense = [randn(n, Hkv, D, seed=seed + 10 * b + 1) for b, n in enumerate(lens)]
    k_pool = randn(num_pages, page_size, Hkv, D, seed=seed + 100).to(dtype)
    v_pool = randn(num_pages, page_size, Hkv, D, seed=seed + 101).to(dtype)
    slots, at = [], 0
    for b, n in enumerate(lens):
        ids = perm[at:at + pages_per[b]]
        at += pages_per[b]
        table[b, :len(ids)] = ids.to(torch.int32)
        slots.append(torch.tensor([int(ids[i // page_size]) * page_size + i % page_size for i in range(n)]))
    return k_pool, v_pool, table, k_dense, v_dense, torch.cat(slots).to(torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_decode_through_write_kv_slots(dtype):
    B, Hq, Hkv, D, page = 3, 8, 2, 64, 16
    lens = [1, 40, 100]
    k_pool, v_pool, table, k_dense, v_dense, slots = paged_cache(B, lens, Hkv, D, page, seed=5, dtype=dtype)
    ta.write_kv_slots(torch.cat(k_dense).to(dtype), torch.cat(v_dense).to(dtype), k_pool, v_pool, slots)
    q = randn(B, 1, Hq, D, seed=6).to(dtype)
    o, lse = ta.forward_paged(q, k_pool, v_pool, table, torch.tensor(lens, dtype=torch.int32))
    for b in range(B):
        want, want_lse = reference.attention(q[b:b + 1], k_dense[b].unsqueeze(0).to(dtype),
                                             v_dense[b].unsqueeze(0).to(dtype))
        naive, _ = reference.attention(q[b:b + 1], k_dense[b].unsqueeze(0).to(dtype),
                                       v_dense[b].unsqueeze(0).to(dtype), dtype=dtype)
        floor = 2e-6 if dtype == torch.float32 else 1e-3
        assert err(o[b:b + 1], want) <= 2 * err(naive, want) + floor


def test_paged_decode_int8_cache():
    B, Hq, Hkv, D, page = 2, 4, 2, 32, 16
    lens = [33, 70]
    k_pool, v_pool, table, k_dense, v_dense, slots = paged_cache(B, lens, Hkv, D, page, seed=8)
    k8 = torch.zeros(k_pool.shape, dtype=torch.int8)
    v8 = torch.zeros(v_pool.shape, dtype=torch.int8)
    ks = torch.zeros(k_pool.shape[0], Hkv)
    vs = torch.zeros(k_pool.shape[0], Hkv)
    ta.write_kv_slots(torch.cat(k_dense), torch.cat(v_dense), k8, v8, slots, ks, vs)
    q = randn(B, 1, Hq, D, seed=9)
    o, _ = ta.forward_paged(q, k8, v8, table, torch.tensor(lens, dtype=torch.int32), k_scale=ks, v_scale=vs)
    # Against attention over the dequantized cache (the quantization is the cache's, not the kernel's).
    for b in range(B):
        rows = slots[sum(lens[:b]):sum(lens[:b + 1])]
        kd = (k8.reshape(-1, Hkv, D)[rows].float() * ks[rows // page].unsqueeze(-1)).unsqueeze(0)
        vd = (v8.reshape(-1, Hkv, D)[rows].float() * vs[rows // page].unsqueeze(-1)).unsqueeze(0)
        want, _ = reference.attention(q[b:b + 1], kd, vd)
        assert err(o[b:b + 1], want) < 2e-6


def test_merge_states_of_two_key_halves_is_attention_over_all():
    q, k, v = randn(2, 7, 4, 32, seed=1), randn(2, 50, 4, 32, seed=2), randn(2, 50, 4, 32, seed=3)
    oa, la = ta.attention(q, k[:, :20], v[:, :20])
    ob, lb = ta.attention(q, k[:, 20:], v[:, 20:])
    o, lse = ta.merge_states(oa, la, ob, lb)
    want, want_lse = reference.attention(q, k, v)
    assert err(o, want) < 2e-6 and err(lse, want_lse) < 1e-5


# ------------------------------------------------------------------------------------------------
# torch.compile and errors.

def test_compile_fullgraph_traces_forward_and_backward():
    torch._dynamo.reset()

    def layer(q, k, v, bias):
        out = ta.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        return (out * out).sum()

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    q, k, v = randn(1, 4, 10, 16, seed=1), randn(1, 2, 12, 16, seed=2), randn(1, 2, 12, 16, seed=3)
    bias = randn(10, 12, seed=4)
    ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    compiled(*ins, bias).backward()
    layer(*ref, bias).backward()
    for a, b in zip(ins, ref):
        assert torch.equal(a.grad, b.grad)


def test_compile_with_inductor():
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: ta.attention(q, k, v, causal=True)[0] * 2, fullgraph=True)
    q, k, v = randn(1, 8, 2, 16, seed=1), randn(1, 8, 2, 16, seed=2), randn(1, 8, 2, 16, seed=3)
    assert torch.equal(fn(q, k, v), ta.attention(q, k, v, causal=True)[0] * 2)


def test_errors_name_the_parameter_and_write_nothing():
    q, k, v = randn(1, 4, 2, 8, seed=1), randn(1, 4, 2, 8, seed=2), randn(1, 4, 2, 8, seed=3)
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.attention(q, k, v.to(torch.bfloat16))
    assert e.value.parameter == "v"
    with pytest.raises(tileattn.InvalidArgument, match="float64"):
        ta.attention(q.double(), k.double(), v.double())
    with pytest.raises(tileattn.InvalidArgument, match="dropout_p"):
        ta.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(tileattn.InvalidArgument, match="enable_gqa"):
        ta.scaled_dot_product_attention(q.transpose(1, 2), k[:, :, :1].transpose(1, 2), v[:, :, :1].transpose(1, 2))
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.attention(q, k, v, window=(-2, 0))
    assert "window" in e.value.parameter
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError
        ta.attention(q, k, v, softmax_scale=float("nan"))
    o = torch.full((1, 4, 2, 8), 7.0)
    with pytest.raises(tileattn.InvalidArgument):
        tileattn._C.forward(q, k, v[:, :3], o, None, tileattn.make_options())
    assert bool((o == 7.0).all())


def test_active_isa_is_reported():
    assert tileattn.active_isa() in ("avx512-bf16+amx", "avx512-bf16", "avx512", "avx2", "generic")


def test_opcheck_every_op():
    """torch.library.opcheck: schema, fake (meta) implementations, autograd registration and
    AOT dispatch of each op, on the registered ops themselves (the wrappers call the
    implementation directly when nothing traces and no gradient is asked for)."""
    q, k, v = randn(1, 6, 4, 16, seed=1), randn(1, 9, 2, 16, seed=2), randn(1, 9, 2, 16, seed=3)
    sinks, bias = randn(4, seed=4), randn(1, 4, 6, 9, seed=5)
    for t in (q, k, v, sinks, bias):
        t.requires_grad_(True)
    ops = torch.ops.tileattn
    rng = torch.tensor([11, 2], dtype=torch.int64)  # dropout's [seed, offset]
    torch.library.opcheck(ops.fwd, (q, k, v, 0.5, True, False, -1, -1, 0.0, None, sinks, bias, None, 0.0, None))
    torch.library.opcheck(ops.fwd, (q, k, v, 0.5, True, False, -1, -1, 0.0, None, sinks, bias, None, 0.2, rng))
    o, lse = ops.fwd(q, k, v, None, False, False, -1, -1, 0.0, None, None, None, None, 0.0, None)
    # The backward has no backward of its own (no double backward): its inputs need no gradient.
    d = [t.detach() for t in (q, k, v, sinks, bias)]
    torch.library.opcheck(ops.bwd, (o.detach(), d[0], d[1], d[2], o.detach(), lse, None, False, False, -1, -1, 0.0,
                                    None, d[3], d[4], None, 0.2, rng, True, True))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    torch.library.opcheck(ops.varlen_fwd, (q[0], k[0, :6], v[0, :6], cu, cu, 4, 4, None, True, -1, -1, 0.0, None,
                                           None, 0.3, rng))
    k_pool, v_pool = randn(3, 4, 2, 16, seed=6), randn(3, 4, 2, 16, seed=7)
    table, lens = torch.tensor([[2, 0]], dtype=torch.int32), torch.tensor([7], dtype=torch.int32)
    torch.library.opcheck(ops.paged_fwd, (q[:, :1].detach(), k_pool, v_pool, table, lens, None, False, -1, -1, 0.0,
                                          None, None, None, None, "", 0))
    torch.library.opcheck(ops.merge_states, (o.detach(), lse, o.detach(), lse))
    ids = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2], dtype=torch.int32)
    torch.library.opcheck(ops.flex_fwd, (q, k, v, None, 0.0, None, [0, 3, 0, 0, 2, 0, 0, 0], ids, ids, None, None, 0,
                                         4, 4))
    slots = torch.tensor([0, 5, -1], dtype=torch.int64)
    torch.library.opcheck(ops.write_kv_slots, (k[0, :3].detach(), v[0, :3].detach(), k_pool.clone(), v_pool.clone(),
                                               slots, None, None, ""))


@pytest.mark.parametrize("shape", [(2, 1, 1, 11), (9, 11), (2, 4, 9, 11)], ids=["padding", "2d", "full"])
def test_float_mask_gradient_sums_over_its_broadcast_dimensions(shape):
    """A float attn_mask that requires grad gets d(loss)/d(mask) in its own shape (and dtype),
    summed over the dimensions it broadcasts, as SDPA's float64 autograd gives it."""
    q, k, v = sdpa_inputs(2, 4, 2, 9, 11, 16, 16, seed=21)
    m0 = randn(*shape, seed=22)
    dout = randn(2, 4, 9, 16, seed=23)

    def grad(fn, dtype):
        m = m0.detach().to(dtype).clone().requires_grad_(True)
        fn(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=m, enable_gqa=True).backward(dout.to(dtype))
        return m.grad

    want = grad(F.scaled_dot_product_attention, torch.float64)
    naive = grad(F.scaled_dot_product_attention, torch.float32)
    got = grad(ta.scaled_dot_product_attention, torch.float32)
    assert got.shape == m0.shape and got.dtype == torch.float32
    assert err(got, want) <= 3 * err(naive, want) + 1e-5
    # bf16 in, bf16 gradient out
    mb = m0.detach().to(torch.bfloat16).requires_grad_(True)
    ta.scaled_dot_product_attention(q, k, v, attn_mask=mb, enable_gqa=True).backward(dout)
    assert mb.grad.dtype == torch.bfloat16 and mb.grad.shape == m0.shape


@pytest.mark.parametrize("scale", [None, -0.3], ids=["default_scale", "negative_scale"])
def test_paged_decode_object_gives_forward_paged_bits(scale):
    B, Hq, Hkv, D, page = 3, 8, 2, 64, 16
    lens = [1, 40, 100]
    k_pool, v_pool, table, k_dense, v_dense, slots = paged_cache(B, lens, Hkv, D, page, seed=15)
    ta.write_kv_slots(torch.cat(k_dense), torch.cat(v_dense), k_pool, v_pool, slots)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    sinks = randn(Hq, seed=16)
    decode = ta.PagedDecode(softmax_scale=scale, sinks=sinks, window=(63, 0))
    out = torch.full((B, 1, Hq, D), 7.0)
    lse = torch.empty(B, Hq, 1)
    for step in range(3):  # a loop reusing its outputs
        q = randn(B, 1, Hq, D, seed=20 + step)
        got, got_lse = decode.run(q, k_pool, v_pool, table, seqlens, out=out, lse=lse)
        assert got is out and got_lse is lse
        want, want_lse = ta.forward_paged(q, k_pool, v_pool, table, seqlens, softmax_scale=scale, sinks=sinks,
                                          window=(63, 0))
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    o_alloc, none = decode.run(q, k_pool, v_pool, table, seqlens)
    assert torch.equal(o_alloc, want) and none is None
    with pytest.raises(tileattn.InvalidArgument) as e:
        decode.run(q, k_pool, v_pool, table, seqlens[:2])
    assert e.value.parameter.startswith("cache_seqlens")
