"""tileattn as a Hugging Face transformers ``attn_implementation``.

This module holds ``register()``, which adds tileattn to ``transformers.AttentionInterface``
(the attention function, ``attention_forward``) and to
``transformers.masking_utils.AttentionMaskInterface`` (the mask builder, ``sdpa_mask``'s
contract), after which any model whose attention goes through ``ALL_ATTENTION_FUNCTIONS``
(Llama, Mistral, Qwen, Gemma 2, GPT-OSS, ...) runs its attention on tileattn's CPU kernels,
forward and backward::

    import tileattn.transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    tileattn.transformers.register()                  # name="tileattn" by default
    cfg = AutoConfig.for_model("llama", num_hidden_layers=2, hidden_size=128)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tileattn")
    model.set_attn_implementation("tileattn")        # or switch a loaded model over

The contract is SDPA's (``transformers/integrations/sdpa_attention.py``): the mask builder
is transformers' ``sdpa_mask``, which returns ``None`` when a plain causal mask is enough,
else a boolean ``[B, 1, L, S]`` mask (True attends) that already holds causality, padding,
sliding windows and packing. The attention function then calls
``tileattn.torch.attention`` on ``[B, L, H, D]`` views of the ``[B, H, L, D]`` tensors
(no copies, GQA without ``repeat_kv``):

- no mask and causal, L > 1: tileattn's own causal mask (no mask tensor is built). Under
  that contract a missing mask with S > L only comes from a prefill into an empty static
  cache, whose keys past L are unwritten slots: SDPA's top-left ``is_causal``, so K and V
  are cut to their first L rows as ``sdpa_attention_forward`` does.
- no mask, L == 1 (decoding): every key.
- a mask: a boolean one goes to ``mask=``, a float (additive) one to ``bias=``.
- ``softcap`` (Gemma 2's ``attn_logit_softcapping``, as the model passes it), ``s_aux``
  (GPT-OSS's learned sinks; differentiable), ``position_bias`` (T5-style, added as a
  differentiable bias) and ``scaling`` go to the kernel. ``sliding_window`` is carried by
  the mask; without one it is passed to the kernel as well (then it changes nothing, as
  transformers only skips the mask while the keys fit in the window).
- ``dropout`` (the model's ``attention_dropout``) is tileattn's attention dropout while the
  module is training (ignored otherwise, as ``nn.Dropout`` does): its seed drawn from torch's
  generator, its decisions regenerated in the backward.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import torch as _ta

__all__ = ["register", "attention_forward", "DEFAULT_NAME"]

DEFAULT_NAME = "tileattn"

_warned_output_attentions = False


def _warn_once_output_attentions() -> None:
    global _warned_output_attentions
    if not _warned_output_attentions:
        _warned_output_attentions = True
        import warnings
        warnings.warn("tileattn: `output_attentions=True` is not supported (the attention weights are never "
                      "formed); they are returned as None. Use attn_implementation='eager' to get them.",
                      stacklevel=3)


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, position_bias: Optional[Tensor] = None,
                      **kwargs) -> Tuple[Tensor, None]:
    """transformers' attention-function signature (``sdpa_attention_forward``'s):
    query [B, Hq, L, D], key [B, Hkv, S, D], value [B, Hkv, S, Dv], attention_mask None, bool
    (True attends) or float (added), broadcastable to [B, Hq, L, S]. Returns
    (attn_output [B, L, Hq, Dv] contiguous, None)."""
    # Dropout in training only, as nn.Dropout (transformers passes 0 outside training anyway).
    dropout_p = float(dropout) if dropout and getattr(module, "training", False) else 0.0
    if kwargs.get("output_attentions", False):
        _warn_once_output_attentions()

    L, S = query.shape[2], key.shape[2]
    # As sdpa_attention_forward: the is_causal passed in wins over the module's attribute, and a
    # mask (when there is one) already holds causality.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and attention_mask is None and L > 1

    if causal and S > L:
        # Only a prefill into an empty static cache gets here (see the module's docstring): SDPA's
        # top-left is_causal, i.e. keys [0, L). Cutting K/V is the same and cheaper.
        key, value = key[:, :, :L], value[:, :, :L]
        if position_bias is not None:
            position_bias = position_bias[..., :L]
        S = L

    bias, mask = _ta._split_mask(attention_mask)
    if position_bias is not None:
        bias = position_bias if bias is None else position_bias + bias

    window = (-1, -1)
    sliding_window = kwargs.get("sliding_window")
    if causal and sliding_window is not None and int(sliding_window) > 0:
        # transformers' sliding_window_overlay: key j is visible from query i iff i - j < sliding_window.
        window = (int(sliding_window) - 1, 0)

    softcap = kwargs.get("softcap")
    softcap = float(softcap) if softcap is not None and softcap > 0 else 0.0

    if "s_aux" in kwargs:
        sinks = kwargs["s_aux"]
    else:
        sinks = getattr(module, "sinks", None)
        sinks = sinks if isinstance(sinks, Tensor) else None

    # Batch broadcasting, as SDPA does (e.g. learned queries with batch 1): stride-0 views.
    if query.shape[0] != key.shape[0]:
        if query.shape[0] == 1:
            query = query.expand(key.shape[0], -1, -1, -1)
        elif key.shape[0] == 1:
            key = key.expand(query.shape[0], -1, -1, -1)
            value = value.expand(query.shape[0], -1, -1, -1)

    out, _ = _ta.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                           softmax_scale=scaling, causal=causal, top_left=False, window=window, softcap=softcap,
                           sinks=sinks, bias=bias, mask=mask, dropout_p=dropout_p)
    return out, None


def register(name: str = DEFAULT_NAME) -> str:
    """Registers tileattn under ``name`` as a transformers attention implementation (the
    attention function and its mask builder). Idempotent. Returns ``name``; then pass
    ``attn_implementation=name`` to ``from_config`` / ``from_pretrained``, or call
    ``model.set_attn_implementation(name)``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if not isinstance(name, str) or not name or name == "eager" or "|" in name or "/" in name \
            or any(word in name for word in ("sdpa", "flash", "flex")):
        # transformers treats such names specially: its own implementations' checks, "paged|"
        # prefixes, "org/repo" kernels from the Hub.
        raise ValueError(f"tileattn: name: {name!r} is reserved by transformers; pick another (default "
                         f"{DEFAULT_NAME!r})")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
