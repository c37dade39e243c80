"""A Hugging Face model on tileattn: register it as an attn_implementation, then generate and
take a training step, and check both against transformers' own SDPA path. The Llama here has
random weights from a small config (no download); a real checkpoint works the same way with
from_pretrained(..., attn_implementation="tileattn").

    pip install ./python torch transformers     # from the repository's root
    python examples/python/transformers_generate.py
"""
import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import tileattn.transformers

torch.manual_seed(0)
tileattn.transformers.register()  # adds "tileattn" to transformers' attention functions

config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = LlamaForCausalLM(config).eval()
reference = LlamaForCausalLM(copy.deepcopy(config)).eval()  # its own config: the choice lives there
reference.load_state_dict(model.state_dict())
model.set_attn_implementation("tileattn")
reference.set_attn_implementation("sdpa")
assert model.config._attn_implementation == "tileattn" and reference.config._attn_implementation == "sdpa"

prompt = torch.randint(0, 256, (2, 12))
mask = torch.ones_like(prompt)
with torch.no_grad():
    ours = model.generate(prompt, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    theirs = reference.generate(prompt, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
assert torch.equal(ours, theirs)
print("greedy generation with the KV cache, identical to sdpa:", ours[0, 12:].tolist())

model.train()
reference.train()
batch = torch.randint(0, 256, (2, 32))
loss = model(batch, labels=batch).loss
loss_ref = reference(batch, labels=batch).loss
loss.backward()
loss_ref.backward()
grad = model.model.layers[0].self_attn.q_proj.weight.grad
grad_ref = reference.model.layers[0].self_attn.q_proj.weight.grad
assert abs(loss.item() - loss_ref.item()) < 1e-5 and (grad - grad_ref).abs().max() < 1e-5
print(f"training step: loss {loss.item():.6f} (sdpa {loss_ref.item():.6f}), "
      f"max |dW_q - dW_q(sdpa)| = {(grad - grad_ref).abs().max():.1e}")
