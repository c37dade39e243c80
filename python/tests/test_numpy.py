"""tileattn's NumPy calls against a float64 NumPy reference: they run where PyTorch is absent.
Random inputs of awkward sizes; arrays seen in place (strided views, read-only inputs)."""
import numpy as np
import pytest

import tileattn


def reference(q, k, v, scale=None, causal=False):
    """O and LSE of q [B, Nq, Hq, D], k, v [B, Nk, Hkv, D] in float64; causal is bottom-right."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    B, nq, hq, d = q.shape
    nk, g = k.shape[1], hq // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (1 / np.sqrt(d) if scale is None else scale)
    if causal:
        visible = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq
        s = np.where(visible, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", p / np.where(total > 0, total, 1), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + m)[..., 0]
    return o, lse


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("nq,nk", [(1, 1), (17, 17), (127, 33), (5, 200)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_float64(nq, nk, causal):
    q, k, v = rand(2, nq, 4, 24, seed=1), rand(2, nk, 2, 24, seed=2), rand(2, nk, 2, 24, seed=3)
    o, lse = tileattn.attention(q, k, v, causal=causal)
    want, want_lse = reference(q, k, v, causal=causal)
    naive, _ = reference(q, k, v, causal=causal)  # float64: the floor is float32's rounding
    assert o.dtype == np.float32 and o.shape == want.shape
    assert np.abs(o - want).max() < 2e-6
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.abs(lse[finite] - want_lse[finite]).max() < 1e-5


def test_strided_and_read_only_inputs_are_read_in_place():
    qkv = rand(2, 30, 3, 4, 16, seed=5)           # [B, N, 3, H, D]: a fused projection
    q, k, v = qkv[:, :, 0], qkv[:, ::2, 1], qkv[:, ::2, 2]
    q.flags.writeable = False
    o, _ = tileattn.attention(q, k, v)
    want, _ = reference(q, k, v)
    assert np.abs(o - want).max() < 2e-6


def test_float16_matches_float64_within_the_rule():
    q, k, v = (rand(1, 33, 2, 32, seed=s, dtype=np.float16) for s in (1, 2, 3))
    o, _ = tileattn.attention(q, k, v, causal=True)
    want, _ = reference(q, k, v, causal=True)
    assert o.dtype == np.float16
    assert np.abs(o.astype(np.float64) - want).max() < 2e-3


def test_backward_matches_finite_differences_of_the_reference():
    q, k, v = rand(1, 6, 2, 8, seed=1), rand(1, 7, 2, 8, seed=2), rand(1, 7, 2, 8, seed=3)
    dout = rand(1, 6, 2, 8, seed=4)
    o, lse = tileattn.attention(q, k, v, causal=True)
    dq, dk, dv = tileattn.attention_backward(dout, q, k, v, o, lse, causal=True)
    eps = 1e-6
    for x, g in ((q, dq), (k, dk), (v, dv)):
        x64 = x.astype(np.float64)
        num = np.zeros_like(x64)
        for idx in np.ndindex(*x.shape):
            for sign in (1, -1):
                y = x64.copy()
                y[idx] += sign * eps
                args = [y if t is x else t for t in (q, k, v)]
                num[idx] += sign * (reference(*args, causal=True)[0] * dout).sum() / (2 * eps)
        assert np.abs(g - num).max() < 2e-5


def test_varlen_matches_each_sequence():
    lens = [3, 0, 20]
    cu = np.array([0] + list(np.cumsum(lens)), np.int32)
    q, k, v = rand(int(cu[-1]), 4, 16, seed=1), rand(int(cu[-1]), 4, 16, seed=2), rand(int(cu[-1]), 4, 16, seed=3)
    o, lse = tileattn.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(len(lens)):
        s = slice(cu[b], cu[b + 1])
        if lens[b]:
            want, _ = reference(q[None, s], k[None, s], v[None, s], causal=True)
            assert np.abs(o[s] - want[0]).max() < 2e-6


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_attention_chunk_is_the_chunk_mask(chunk):
    q, k, v = rand(1, 45, 2, 16, seed=4), rand(1, 131, 2, 16, seed=5), rand(1, 131, 2, 16, seed=6)
    o = tileattn.attention(q, k, v, causal=True, attention_chunk=chunk, return_lse=False)
    pos = np.arange(45)[:, None] + 131 - 45
    keys = np.arange(131)[None, :]
    visible = (keys <= pos) & (keys // chunk == pos // chunk)
    want = tileattn.attention(q, k, v, mask=np.broadcast_to(visible, (1, 1, 45, 131)).copy(), return_lse=False)
    assert np.abs(o - want).max() < 2e-6


def test_batch_invariant_gives_a_sequence_the_same_bits_in_any_batch():
    x = [rand(37, 4, 16, seed=7), rand(50, 2, 16, seed=8), rand(50, 2, 16, seed=9)]
    other = [rand(300, 4, 16, seed=10), rand(700, 2, 16, seed=11), rand(700, 2, 16, seed=12)]
    alone = tileattn.attention_varlen(*x, np.array([0, 37], np.int32), np.array([0, 50], np.int32), 37, 50,
                                      causal=True, batch_invariant=True)[0]
    both = tileattn.attention_varlen(*(np.concatenate([a, b]) for a, b in zip(x, other)),
                                     np.array([0, 37, 337], np.int32), np.array([0, 50, 750], np.int32), 300, 700,
                                     causal=True, batch_invariant=True)[0]
    assert np.array_equal(alone, both[:37])


def test_paged_decode_and_merge_states():
    page, Hkv, D = 4, 2, 16
    k_pool, v_pool = rand(6, page, Hkv, D, seed=1), rand(6, page, Hkv, D, seed=2)
    table = np.array([[5, 0, 3]], np.int32)
    q = rand(1, 1, 4, D, seed=3)
    o, lse = tileattn.forward_paged(q, k_pool, v_pool, table, np.array([10], np.int32))
    k = k_pool[table[0]].reshape(-1, Hkv, D)[None, :10]
    v = v_pool[table[0]].reshape(-1, Hkv, D)[None, :10]
    want, want_lse = reference(q, k, v)
    assert np.abs(o - want).max() < 2e-6
    oa, la = tileattn.attention(q, k[:, :4], v[:, :4])
    ob, lb = tileattn.attention(q, k[:, 4:], v[:, 4:])
    om, lm = tileattn.merge_states(oa, la, ob, lb)
    assert np.abs(om - want).max() < 2e-6 and np.abs(lm - want_lse).max() < 1e-5


def test_bad_arguments_raise_invalid_argument_naming_them():
    q, k, v = rand(1, 4, 2, 8), rand(1, 4, 2, 8), rand(1, 4, 2, 8)
    with pytest.raises(tileattn.InvalidArgument) as e:
        tileattn.attention(q, k, v.astype(np.float64))
    assert e.value.parameter == "v"
    with pytest.raises(tileattn.InvalidArgument) as e:
        tileattn.attention(q[0], k, v)
    assert e.value.parameter == "q"
    with pytest.raises(tileattn.InvalidArgument) as e:
        tileattn.attention(q, k, v, softmax_scale=-1.0)
    assert e.value.parameter == "softmax_scale"
    with pytest.raises(tileattn.InvalidArgument) as e:
        tileattn.forward_paged(q[:, :1], k, v, np.zeros((1, 1), np.int32), np.array([4], np.int32), kv_format="x")
    assert e.value.parameter == "kv_format"
    pool = np.zeros((2, 4, 2, 8), np.float32)
    with pytest.raises(tileattn.InvalidArgument) as e:
        tileattn.write_kv_slots(k[0].astype(np.float64), v[0], pool, pool.copy(), np.arange(4, dtype=np.int64))
    assert e.value.parameter == "k_new"


def test_active_isa():
    assert tileattn.active_isa() in ("avx512-bf16+amx", "avx512-bf16", "avx512", "avx2", "generic")
