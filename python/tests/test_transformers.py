"""tileattn.transformers against transformers' own SDPA path on a random-weight Llama (GQA):
logits with and without left padding, greedy generation with the KV cache (dynamic and
static), and AdamW training losses step by step; plus the attention function alone against
SDPA / eager references for sinks, softcap, position bias, decoding and dropout. No
downloads: the models are built from a small LlamaConfig. Runs in a few seconds on 2 cores."""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tileattn.torch as ta  # noqa: E402
import tileattn.transformers as tt  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.set_num_threads(2)
NAME = tt.register()

VOCAB = 256
LOGIT_TOL = 1e-5
LOSS_RTOL = 1e-5


def _config():
    return LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=192, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _pair(train=False):
    """The same random weights under attn_implementation="sdpa" and "tileattn" (float32).
    Each model gets its own config: from_config writes the implementation into it."""
    torch.manual_seed(1234)
    ref = LlamaForCausalLM._from_config(copy.deepcopy(_config()), attn_implementation="sdpa")
    ours = LlamaForCausalLM._from_config(copy.deepcopy(_config()), attn_implementation=NAME)
    ours.load_state_dict(ref.state_dict())
    assert ref.config._attn_implementation == "sdpa"
    assert ours.config._attn_implementation == NAME
    for m in (ref, ours):
        m.float()
        m.train(train)
    return ref, ours


@pytest.fixture(scope="module")
def models():
    return _pair()


@pytest.fixture
def count_calls(monkeypatch):
    """Counts calls into tileattn.torch.attention, so a test knows tileattn really ran."""
    calls = {"n": 0, "mask": 0, "causal": 0}
    real = ta.attention

    def spy(*args, **kwargs):
        calls["n"] += 1
        calls["mask"] += kwargs.get("mask") is not None
        calls["causal"] += bool(kwargs.get("causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ta, "attention", spy)
    return calls


def _batch(B=3, N=40, seed=0, pad=(0, 7, 19)):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, N), generator=g)
    mask = torch.ones_like(ids)
    for b, p in enumerate(pad[:B]):
        mask[b, :p] = 0
        ids[b, :p] = 0
    return ids, mask


# ---------------------------------------------------------------------------------------------
# (a) logits

@pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "left_padding"])
def test_logits_match_sdpa(models, count_calls, padded):
    ref, ours = models
    ids, mask = _batch()
    am = mask if padded else None
    with torch.no_grad():
        lr = ref(ids, attention_mask=am).logits
        lo = ours(ids, attention_mask=am).logits
    assert count_calls["n"] == ours.config.num_hidden_layers
    # Unpadded: tileattn's own causal mask, no mask tensor; padded: a boolean mask.
    assert count_calls["mask"] == (ours.config.num_hidden_layers if padded else 0)
    assert count_calls["causal"] == (0 if padded else ours.config.num_hidden_layers)
    assert torch.isfinite(lo).all()
    # Every position, pad rows included (a row that sees no key gives 0 in both).
    diff = (lr - lo).abs().max().item()
    print(f"\nlogits {'left-padded' if padded else 'unpadded'}: max |tileattn - sdpa| = {diff:.3e}")
    assert diff < LOGIT_TOL


def test_set_attn_implementation_switches_a_model(count_calls):
    ref, _ = _pair()
    ids, mask = _batch(B=2, N=16, seed=5)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        ref.set_attn_implementation(NAME)
        assert ref.config._attn_implementation == NAME
        got = ref(ids, attention_mask=mask).logits
    assert count_calls["n"] == ref.config.num_hidden_layers
    assert (want - got).abs().max().item() < LOGIT_TOL


# ---------------------------------------------------------------------------------------------
# (b) greedy generation with the KV cache

@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_matches_sdpa(models, count_calls, cache):
    ref, ours = models
    ids, mask = _batch(B=2, N=12, seed=1, pad=(0, 5))
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        out_r = ref.generate(ids, **kw)
        out_o = ours.generate(ids, **kw)
        # The same without padding: the prefill runs on tileattn's causal mask (for the static
        # cache: keys cut to the prompt) and decoding without a mask.
        out_r1 = ref.generate(ids[:1], **{**kw, "attention_mask": mask[:1]})
        out_o1 = ours.generate(ids[:1], **{**kw, "attention_mask": mask[:1]})
    assert count_calls["n"] >= 2 * 12 * ours.config.num_hidden_layers
    print(f"\ngreedy ({cache} cache): {out_o[:, ids.shape[1]:].tolist()}")
    assert out_o.shape == (2, ids.shape[1] + 12)
    assert torch.equal(out_r, out_o)
    assert torch.equal(out_r1, out_o1)


# ---------------------------------------------------------------------------------------------
# (c) training

def test_training_losses_match_sdpa():
    ref, ours = _pair(train=True)
    opt_r = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.01)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=3e-3, weight_decay=0.01)
    worst = 0.0
    losses = []
    for step in range(12):
        # Alternate unpadded batches (causal path) and left-padded ones (mask path).
        ids, mask = _batch(B=4, N=32, seed=100 + step, pad=(0, 3, 0, 9) if step % 2 else (0, 0, 0, 0))
        labels = ids.masked_fill(mask == 0, -100)
        am = mask if step % 2 else None
        step_losses = []
        for model, opt in ((ref, opt_r), (ours, opt_o)):
            opt.zero_grad(set_to_none=True)
            loss = model(ids, attention_mask=am, labels=labels).loss
            loss.backward()
            opt.step()
            step_losses.append(loss.item())
        lr_, lo_ = step_losses
        rel = abs(lr_ - lo_) / abs(lr_)
        worst = max(worst, rel)
        losses.append((lr_, lo_, rel))
        assert rel < LOSS_RTOL, f"step {step}: sdpa {lr_} vs tileattn {lo_} (relative {rel:.2e})"
    print(f"\ntraining: {len(losses)} AdamW steps, loss {losses[0][0]:.4f} -> {losses[-1][0]:.4f}, "
          f"worst relative loss difference {worst:.3e}")
    assert losses[-1][0] < losses[0][0]  # it trained


# ---------------------------------------------------------------------------------------------
# Models whose attention SDPA cannot run (transformers uses eager for them): GPT-OSS's learned
# sinks with sliding-window layers, Gemma 2's softcap with sliding-window layers.

def _eager_pair(cls, cfg):
    torch.manual_seed(7)
    ref = cls._from_config(copy.deepcopy(cfg), attn_implementation="eager").eval()
    ours = cls._from_config(copy.deepcopy(cfg), attn_implementation=NAME).eval()
    if hasattr(ours.model.layers[0].self_attn, "sinks"):
        with torch.no_grad():
            for layer in ref.model.layers:
                layer.self_attn.sinks.normal_()  # zeros at init: make them count
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _compare_logits_to_eager(ref, ours):
    ids, mask = _batch(B=2, N=20, seed=9, pad=(0, 5))
    with torch.no_grad():
        diff = (ref(ids).logits - ours(ids).logits).abs().max().item()
        # Padded: the rows of real tokens (eager gives pad rows, which see no key, a uniform average).
        real = mask.bool()
        diff_pad = (ref(ids, attention_mask=mask).logits - ours(ids, attention_mask=mask).logits)[real].abs().max().item()
    return ids, mask, diff, diff_pad


def test_gpt_oss_sinks_and_sliding_window_match_eager():
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       max_position_embeddings=256)
    ref, ours = _eager_pair(GptOssForCausalLM, cfg)
    ids, mask, diff, diff_pad = _compare_logits_to_eager(ref, ours)
    print(f"\ngpt-oss logits: max |tileattn - eager| = {diff:.3e}, left-padded {diff_pad:.3e}")
    assert diff < LOGIT_TOL and diff_pad < LOGIT_TOL
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=12, min_new_tokens=12, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ref.generate(ids, **kw), ours.generate(ids, **kw))
    # The sinks' gradients (tileattn's dsinks) against eager's.
    ref.train()
    ours.train()
    for m in (ref, ours):
        m.zero_grad()
        m(ids, labels=ids).loss.backward()
    for a, b in zip(ref.model.layers, ours.model.layers):
        torch.testing.assert_close(b.self_attn.sinks.grad, a.self_attn.sinks.grad, atol=1e-6, rtol=1e-4)


def test_gemma2_softcap_and_sliding_window_match_eager():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    cfg = Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                       attn_logit_softcapping=2.0, query_pre_attn_scalar=16, max_position_embeddings=256)
    ref, ours = _eager_pair(Gemma2ForCausalLM, cfg)
    _, _, diff, diff_pad = _compare_logits_to_eager(ref, ours)
    print(f"\ngemma2 logits: max |tileattn - eager| = {diff:.3e}, left-padded {diff_pad:.3e}")
    assert diff < LOGIT_TOL and diff_pad < LOGIT_TOL


# ---------------------------------------------------------------------------------------------
# The attention function alone.

class _Module(torch.nn.Module):
    def __init__(self, groups, causal=True):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = causal


def _qkv(B=2, Hq=4, Hkv=2, L=9, S=9, D=16, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((Hq, L), (Hkv, S), (Hkv, S)))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v


def _sdpa_ref(module, q, k, v, mask, **kw):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, q, k, v, mask, **kw)[0]


def test_attention_forward_decode_prefill_and_bias():
    m = _Module(groups=2)
    # Decoding: one query, no mask, every key.
    q, k, v = _qkv(L=1, S=23)
    got, none = tt.attention_forward(m, q, k, v, None, scaling=0.3)
    assert none is None and got.shape == (2, 1, 4, 16) and got.is_contiguous()
    torch.testing.assert_close(got, _sdpa_ref(m, q, k, v, None, scaling=0.3), atol=1e-5, rtol=1e-5)
    # Prefill into an empty static cache: no mask, S > L (keys past L are empty slots).
    q, k, v = _qkv(L=7, S=16, seed=1)
    got, _ = tt.attention_forward(m, q, k, v, None)
    torch.testing.assert_close(got, _sdpa_ref(m, q, k, v, None), atol=1e-5, rtol=1e-5)
    # Boolean and float masks, and a T5-style position bias on top of each.
    q, k, v = _qkv(L=6, S=11, seed=2)
    keep = torch.rand(2, 1, 6, 11, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[..., 0] = True
    addend = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    pb = torch.randn(1, 4, 6, 11)
    for mask in (keep, addend):
        for bias in (None, pb):
            got, _ = tt.attention_forward(m, q, k, v, mask, position_bias=bias)
            torch.testing.assert_close(got, _sdpa_ref(m, q, k, v, mask, position_bias=bias), atol=1e-5, rtol=1e-5)


def _eager(q, k, v, scaling, causal=True, softcap=None, sinks=None):
    """GPT-OSS's / Gemma 2's eager attention (repeat_kv, softcap, sink column)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(2, 3) * scaling
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(S - L + 1), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)], -1)
    p = torch.softmax(s, -1)
    if sinks is not None:
        p = p[..., :-1]
    return (p @ v).transpose(1, 2)


def test_attention_forward_sinks_and_softcap_with_grads():
    m = _Module(groups=2)
    m.sinks = torch.nn.Parameter(torch.randn(4))
    q, k, v = _qkv(L=10, S=10, seed=4, grad=True)
    got, _ = tt.attention_forward(m, q, k, v, None, scaling=0.25, s_aux=m.sinks)
    want = _eager(q, k, v, 0.25, sinks=m.sinks)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    gw = torch.randn_like(got)
    g_got = torch.autograd.grad(got, (q, k, v, m.sinks), gw)
    g_want = torch.autograd.grad(want, (q, k, v, m.sinks), gw)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # Without s_aux the module's sinks are used; softcap as Gemma 2 passes it.
    got, _ = tt.attention_forward(m, q, k, v, None, scaling=0.25, softcap=2.0)
    torch.testing.assert_close(got, _eager(q, k, v, 0.25, softcap=2.0, sinks=m.sinks), atol=1e-5, rtol=1e-5)


def test_dropout_applies_in_training_only():
    m = _Module(groups=2)
    q, k, v = _qkv()
    m.eval()
    plain, _ = tt.attention_forward(m, q, k, v, None)
    got, _ = tt.attention_forward(m, q, k, v, None, dropout=0.5)  # ignored outside training, as nn.Dropout does
    assert torch.equal(got, plain)
    m.train()
    torch.manual_seed(3)
    a, _ = tt.attention_forward(m, q, k, v, None, dropout=0.5)
    torch.manual_seed(3)
    b, _ = tt.attention_forward(m, q, k, v, None, dropout=0.5)
    assert torch.equal(a, b) and not torch.equal(a, plain)