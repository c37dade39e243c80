# benchmarks/side_by_side/torch_sdpa.py: PyTorch CPU scaled_dot_product_attention on one shape: median,
# min and max GFLOP/s of R runs after one warm-up (the same count as tileattn's timer).
#   python3 torch_sdpa.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16|fp16]
# Inputs are N(0, 1) from a fixed seed (generated in float32), then cast to the type.
# BATCH=b (default 1) times b sequences of N, as forward_timer does.
import os, sys, time, torch
if len(sys.argv) < 8:
    sys.exit("usage: torch_sdpa.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16|fp16]")
n, d, hq, hkv, causal, threads, repeats = map(int, sys.argv[1:8])
dtypes = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}
name = sys.argv[8] if len(sys.argv) > 8 else "fp32"
if name not in dtypes:
    sys.exit(f"unknown type {name!r} (fp32, bf16 or fp16)")
dtype = dtypes[name]
torch.set_num_threads(threads)
batch = max(1, int(os.environ.get("BATCH", "1")))
g = torch.Generator().manual_seed(1)
q = torch.randn(batch, hq, n, d, generator=g).to(dtype)
k = torch.randn(batch, hkv, n, d, generator=g).to(dtype)
v = torch.randn(batch, hkv, n, d, generator=g).to(dtype)
kw = dict(is_causal=bool(causal), enable_gqa=hq != hkv)
s = []
with torch.no_grad():
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        if r > 0:
            s.append(time.perf_counter() - t0)
s.sort()
flops = 4.0 * batch * hq * n * n * d / (2 if causal else 1)
print(f"torch {str(dtype)[6:]} N {n} d {d} H {hq}/{hkv} {'causal' if causal else 'full  '} threads {threads:2d}"
      f"{f' B {batch}' if batch > 1 else ''}: "
      f"GFLOP/s median {flops / s[len(s) // 2] * 1e-9:7.1f} min {flops / s[-1] * 1e-9:7.1f} max {flops / s[0] * 1e-9:7.1f}")
