"""tileattn.torch.flex_attention (the menu of tileattn.flex) against the float64 definition:
each mask clause and their AND as a boolean mask, the relative-bias score_mod as a bias,
forward and gradients, float32 and bfloat16, several block sizes (the result must not
depend on them)."""
import pytest

torch = pytest.importorskip("torch")

import tileattn  # noqa: E402
import tileattn.flex as tf  # noqa: E402
import tileattn.torch as ta  # noqa: E402

import reference  # noqa: E402

torch.set_num_threads(2)

NQ, NK, HQ, HKV, D = 70, 90, 4, 2, 32


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def doc_ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randint(0, 4, (n,), generator=g)).values.to(torch.int32)


DOC_Q, DOC_KV = doc_ids(NQ, 1), doc_ids(NK, 2)
LAYOUT = (torch.rand(3, 3, generator=torch.Generator().manual_seed(3)) > 0.4).to(torch.uint8)

# (clauses, the same visibility as a function of (i, j) tensors)
MASKS = {
    "none": ([], lambda i, j: torch.ones_like(i, dtype=torch.bool)),
    "causal": ([tf.Causal()], lambda i, j: j <= i),
    "causal_offset": ([tf.Causal(offset=NK - NQ)], lambda i, j: j <= i + NK - NQ),
    "sliding_window": ([tf.SlidingWindow(left=8, right=2, offset=5)],
                       lambda i, j: (i + 5 - j <= 8) & (j - i - 5 <= 2)),
    "document": ([tf.Document(DOC_Q, DOC_KV)], lambda i, j: DOC_Q.long()[i] == DOC_KV.long()[j]),
    "prefix_lm": ([tf.PrefixLM(10)], lambda i, j: (j < 10) | (j <= i)),
    "global_window": ([tf.GlobalWindow(3, 6)], lambda i, j: (i < 3) | (j < 3) | ((i - j).abs() <= 6)),
    "dilated_window": ([tf.DilatedWindow(5, 3)],
                       lambda i, j: (i - j >= 0) & (i - j <= 15) & ((i - j) % 3 == 0)),
    "block_sparse": ([tf.BlockSparse(LAYOUT, 32)], lambda i, j: LAYOUT.bool()[i // 32, j // 32]),
    "causal_and_document": ([tf.Causal(), tf.Document(DOC_Q, DOC_KV)],
                            lambda i, j: (j <= i) & (DOC_Q.long()[i] == DOC_KV.long()[j])),
}


def visibility(fn):
    i = torch.arange(NQ).unsqueeze(1).expand(NQ, NK)
    j = torch.arange(NK).unsqueeze(0).expand(NQ, NK)
    return fn(i, j).reshape(1, 1, NQ, NK)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("relative", [False, True], ids=["plain", "relative_bias"])
def test_flex_matches_float64(name, relative, dtype):
    clauses, fn = MASKS[name]
    mask = visibility(fn)
    q0, k0, v0 = randn(2, NQ, HQ, D, seed=1), randn(2, NK, HKV, D, seed=2), randn(2, NK, HKV, D, seed=3)
    dout = randn(2, NQ, HQ, D, seed=4)
    score_mod = bias = None
    if relative:
        md = 12
        table = randn(HQ, 2 * md + 1, seed=5)
        score_mod = tf.RelativeBias(table, md)
        dist = (torch.arange(NQ).unsqueeze(1) - torch.arange(NK).unsqueeze(0)).clamp(-md, md) + md
        bias = table[:, dist].unsqueeze(0)  # [1, HQ, NQ, NK]

    def run(fn, run_dtype):
        ins = [t.detach().to(run_dtype, copy=True).requires_grad_(True) for t in (q0, k0, v0)]
        o = fn(*ins)
        o.backward(dout.to(run_dtype))
        return [o.detach()] + [t.grad for t in ins]

    def ref(dt):
        return lambda q, k, v: reference.attention(q, k, v, mask=mask, bias=bias, dtype=dt)[0]

    want, naive = run(ref(torch.float64), torch.float64), run(ref(dtype), dtype)
    floor = 1e-6 if dtype == torch.float32 else 1e-3
    for block in ((128, 128), (16, 32)):
        got = run(lambda q, k, v: ta.flex_attention(q, k, v, mask=clauses, score_mod=score_mod, block_size=block)[0],
                  dtype)
        for i, (g, n, w) in enumerate(zip(got, naive, want)):
            e, en = (g.double() - w).abs().max().item(), (n.double() - w).abs().max().item()
            assert e <= (2 if i == 0 else 3) * en + (1 if i == 0 else 10) * floor, (name, block, i, e, en)


def test_flex_result_does_not_depend_on_the_block_size():
    q, k, v = randn(1, NQ, HQ, D, seed=1), randn(1, NK, HKV, D, seed=2), randn(1, NK, HKV, D, seed=3)
    clauses = MASKS["causal_and_document"][0]
    a = ta.flex_attention(q, k, v, mask=clauses, block_size=(128, 128))[0]
    b = ta.flex_attention(q, k, v, mask=clauses, block_size=(8, 8))[0]
    assert torch.equal(a, b)


def test_flex_compiles_fullgraph():
    torch._dynamo.reset()
    q, k, v = randn(1, 16, 2, 8, seed=1), randn(1, 16, 2, 8, seed=2), randn(1, 16, 2, 8, seed=3)
    ids = doc_ids(16, 4)
    fn = torch.compile(lambda q, k, v: ta.flex_attention(q, k, v, mask=[tf.Causal(), tf.Document(ids)])[0],
                       fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(q, k, v), ta.flex_attention(q, k, v, mask=[tf.Causal(), tf.Document(ids)])[0])


def test_flex_errors_name_the_parameter():
    q, k, v = randn(1, 16, 2, 8, seed=1), randn(1, 16, 2, 8, seed=2), randn(1, 16, 2, 8, seed=3)
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.flex_attention(q, k, v, mask=[tf.Document(doc_ids(5, 1))])
    assert e.value.parameter == "doc_q"
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.flex_attention(q, k, v, score_mod=tf.RelativeBias(torch.zeros(3, 5), 2))
    assert e.value.parameter == "table"
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.flex_attention(q, k, v, mask=[tf.DilatedWindow(3, 0)])
    assert e.value.parameter == "dilation"
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.flex_attention(q, k, v, mask=[tf.BlockSparse(torch.ones(1, 1, dtype=torch.uint8), 8)])
    assert e.value.parameter == "layout"
    with pytest.raises(tileattn.InvalidArgument) as e:
        ta.flex_attention(q, k, v, mask=["causal"])
    assert e.value.parameter == "mask"
