# benchmarks/side_by_side/torch_sdpa_decode.py: PyTorch CPU scaled_dot_product_attention for one
# decode step (one query token per sequence) against B contiguous K/V caches of CTX keys, GQA
# through enable_gqa: median, min and max K/V GB/s (bytes in the stored type) of R runs after
# one warm-up, as decode_timer.cpp counts them. FLUSH_MB (default 1024; 0: off) MiB are read
# before every run, as decode_timer.cpp does, so K/V come from memory.
#   python3 torch_sdpa_decode.py B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16]
import os, sys, time, torch
if len(sys.argv) < 8:
    sys.exit("usage: torch_sdpa_decode.py B CTX HEADS_Q HEADS_KV D THREADS REPEATS [fp32|bf16]")
b, ctx, hq, hkv, d, threads, repeats = map(int, sys.argv[1:8])
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[8] if len(sys.argv) > 8 else "fp32"]
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(1)
q = torch.randn(b, hq, 1, d, generator=g).to(dtype)
k = torch.randn(b, hkv, ctx, d, generator=g).to(dtype)
v = torch.randn(b, hkv, ctx, d, generator=g).to(dtype)
flush_mib = int(os.environ.get("FLUSH_MB", "1024"))
flush = torch.ones(flush_mib * 1024 * 1024 // 4) if flush_mib > 0 else None
s = []
with torch.no_grad():
    for r in range(repeats + 1):
        if flush is not None:
            flush.sum()
        t0 = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
        if r > 0:
            s.append(time.perf_counter() - t0)
s.sort()
gb = 2.0 * b * ctx * hkv * d * (4 if dtype == torch.float32 else 2) * 1e-9
print(f"torch decode {str(dtype)[6:]} B {b} ctx {ctx} H {hq}/{hkv} d {d} threads {threads:2d}: "
      f"KV GB/s median {gb / s[len(s) // 2]:7.2f} min {gb / s[-1]:7.2f} max {gb / s[0]:7.2f}")
