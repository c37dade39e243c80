# benchmarks/side_by_side/torch_sdpa_backward.py: PyTorch CPU scaled_dot_product_attention forward +
# backward (autograd, dO given) on one shape: median, min and max GFLOP/s of R runs after one
# warm-up, credited with 3.5x the forward's FLOPs as tileattn's backward_timer.cpp.
#   python3 torch_sdpa_backward.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]
import sys, time, torch
if len(sys.argv) < 8:
    sys.exit("usage: torch_sdpa_backward.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]")
n, d, hq, hkv, causal, threads, repeats = map(int, sys.argv[1:8])
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[8] if len(sys.argv) > 8 else "fp32"]
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
q = torch.randn(1, hq, n, d, generator=g).to(dtype).requires_grad_()
k = torch.randn(1, hkv, n, d, generator=g).to(dtype).requires_grad_()
v = torch.randn(1, hkv, n, d, generator=g).to(dtype).requires_grad_()
dout = torch.randn(1, hq, n, d, generator=g).to(dtype)
kw = dict(is_causal=bool(causal), enable_gqa=hq != hkv)
s = []
for r in range(repeats + 1):
    q.grad = k.grad = v.grad = None
    t0 = time.perf_counter()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    out.backward(dout)
    if r > 0:
        s.append(time.perf_counter() - t0)
s.sort()
flops = 3.5 * 4.0 * hq * n * n * d / (2 if causal else 1)
print(f"torch fwd+bwd {str(dtype)[6:]} N {n} d {d} H {hq}/{hkv} {'causal' if causal else 'full  '} threads {threads:2d}: "
      f"GFLOP/s median {flops / s[len(s) // 2] * 1e-9:7.1f} min {flops / s[-1] * 1e-9:7.1f} max {flops / s[0] * 1e-9:7.1f}")
