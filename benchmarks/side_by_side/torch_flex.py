# benchmarks/side_by_side/torch_flex.py: PyTorch's flex_attention (torch.compile'd, CPU) on one of
# flex_timer.cpp's workloads (B 1, H 16, d 128): median, min and max GFLOP/s of R runs after the
# compiling call (the same count as tileattn's timer: 4 d FLOPs per visible score).
#   python3 torch_flex.py causal|document|block_sparse THREADS REPEATS [fp32|bf16]
# Workloads, FLEX_SCALE and the block-sparse layout (the same 64-bit LCG) are flex_timer.cpp's;
# the block mask is create_block_mask's with BLOCK_SIZE 128, built once before the timing. The
# line gives the visible scores and `blocks` (FNV-1a of the nonempty-block layout) as
# flex_timer.cpp's does; the compiling call's time goes to stderr. Inputs are N(0, 1) from a
# fixed seed (generated in float32), then cast to the type.
import os, sys, time, torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

if len(sys.argv) < 4:
    sys.exit("usage: torch_flex.py causal|document|block_sparse THREADS REPEATS [fp32|bf16]")
workload = sys.argv[1]
threads, repeats = int(sys.argv[2]), int(sys.argv[3])
dtypes = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
name = sys.argv[4] if len(sys.argv) > 4 else "fp32"
if name not in dtypes:
    sys.exit(f"unknown type {name!r} (fp32 or bf16)")
if repeats < 1:
    sys.exit("REPEATS must be >= 1")
dtype = dtypes[name]
heads, dim, block = 16, 128, 128
torch.set_num_threads(threads)  # before compiling: inductor's CPU kernels take their thread count then


def scaled(n):
    """n scaled by FLEX_SCALE, rounded to a multiple of 128, at least 128 (flex_timer.cpp's scaled())."""
    f = float(os.environ.get("FLEX_SCALE") or 1.0)
    return max(block, int(n * f / block + 0.5) * block)


def layout(nb):
    """flex_timer.cpp's sparse_layout(): the diagonal, then distinct blocks drawn by the LCG."""
    total = nb * nb
    l = bytearray(total)
    for b in range(nb):
        l[b * nb + b] = 1
    target, state, count = int(0.10 * total + 0.5), 2026, nb
    while count < target:
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        i = (state >> 33) % total
        if not l[i]:
            l[i] = 1
            count += 1
    return torch.tensor(list(l), dtype=torch.bool).view(nb, nb)


if workload == "causal":
    n = scaled(4096)

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
elif workload == "document":
    doc_len = scaled(1024)
    n = 8 * doc_len
    doc = torch.arange(n, dtype=torch.int32) // doc_len

    def mask_mod(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]
elif workload == "block_sparse":
    n = scaled(8192)
    sparse = layout(n // block)

    def mask_mod(b, h, q_idx, kv_idx):
        return sparse[q_idx // block, kv_idx // block]
else:
    sys.exit(f"unknown workload {workload!r} (causal, document or block_sparse)")

# The visible scores and the nonempty-block hash, the mask evaluated once on every (query, key).
nb = n // block
kv = torch.arange(n)
visible, rows = 0, []
for qb in range(nb):
    m = mask_mod(0, 0, torch.arange(qb * block, (qb + 1) * block)[:, None], kv[None, :])
    visible += int(m.sum())
    rows.append(m.view(block, nb, block).any(dim=2).any(dim=0))  # which key blocks this query block sees
h = 2166136261
for x in torch.stack(rows).flatten().tolist():
    h = ((h ^ int(x)) * 16777619) & 0xFFFFFFFF

g = torch.Generator().manual_seed(1)
q = torch.randn(1, heads, n, dim, generator=g).to(dtype)
k = torch.randn(1, heads, n, dim, generator=g).to(dtype)
v = torch.randn(1, heads, n, dim, generator=g).to(dtype)
block_mask = create_block_mask(mask_mod, None, None, n, n, device="cpu", BLOCK_SIZE=block)
flex = torch.compile(flex_attention)
s = []
with torch.no_grad():
    t0 = time.perf_counter()
    flex(q, k, v, block_mask=block_mask)  # the warm-up: compiles
    print(f"torch_flex {workload} {name} threads {threads}: compile (first call) {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    for r in range(repeats):
        t0 = time.perf_counter()
        flex(q, k, v, block_mask=block_mask)
        s.append(time.perf_counter() - t0)
s.sort()
flops = 4.0 * dim * heads * visible
print(f"torch {str(dtype)[6:]} N {n} d {dim} H {heads}/{heads} {workload} visible {visible} blocks {h:08x} "
      f"threads {threads:2d}: GFLOP/s median {flops / s[len(s) // 2] * 1e-9:7.1f} min {flops / s[-1] * 1e-9:7.1f} "
      f"max {flops / s[0] * 1e-9:7.1f}")
