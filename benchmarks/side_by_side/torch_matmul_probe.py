# benchmarks/side_by_side/torch_matmul_probe.py: PyTorch's bf16 matmul (oneDNN, on AMX where the
# CPU has it) on the shapes of the forward's tile products, one thread, best of 5 batches of
# 200 calls: how fast a mature library's memory-fed bf16 products run on this machine, next to
# benchmarks/amx_breakdown.cpp's figures for tileattn's AMX gemm (docs/performance.md).
#   taskset -c 2 python3 benchmarks/side_by_side/torch_matmul_probe.py
# Shapes are M x N x K in bf16 elements (amx_breakdown counts K in pairs: half these).
import time
import torch

torch.set_num_threads(1)
for (m, n, k) in [(1024, 128, 128), (1024, 128, 512), (256, 256, 2048), (128, 512, 128)]:
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(k, n).bfloat16()
    for _ in range(20):
        torch.matmul(a, b)
    best = 1e9
    for rep in range(5):
        calls = 200
        t = time.perf_counter()
        for _ in range(calls):
            torch.matmul(a, b)
        best = min(best, (time.perf_counter() - t) / calls)
    print(f"torch bf16 matmul {m} x {n} x {k} (1 thread): {2 * m * n * k / best / 1e9:.1f} GFLOP/s")
