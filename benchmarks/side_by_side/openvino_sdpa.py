# benchmarks/side_by_side/openvino_sdpa.py: OpenVINO's CPU ScaledDotProductAttention (opset13) on
# one shape: median, min and max GFLOP/s of R runs after one warm-up, in torch_sdpa.py's format.
#   python3 openvino_sdpa.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]
# A one-node model [1, H, N, D] -> [1, H, N, D] compiled for the CPU with INFERENCE_NUM_THREADS =
# THREADS, PERFORMANCE_HINT = LATENCY and INFERENCE_PRECISION_HINT = the type (bf16: OpenVINO
# computes in bf16 on AMX where the CPU has it; the f32 inputs are converted inside the model,
# a pass over Q, K and V that the times include). Inputs are N(0, 1) from a fixed seed,
# rounded to bf16 first for bf16. Equal K/V and query heads only (the op has no GQA).
import sys, time
import numpy as np
import openvino as ov
try:
    from openvino import opset13 as ops
except ImportError:
    from openvino.runtime import opset13 as ops
if len(sys.argv) < 8:
    sys.exit("usage: openvino_sdpa.py N D HEADS_Q HEADS_KV CAUSAL THREADS REPEATS [fp32|bf16]")
n, d, hq, hkv, causal, threads, repeats = map(int, sys.argv[1:8])
name = sys.argv[8] if len(sys.argv) > 8 else "fp32"
if name not in ("fp32", "bf16"):
    sys.exit(f"unsupported type {name!r} (fp32 or bf16)")
if hq != hkv:
    sys.exit("openvino_sdpa.py: HEADS_Q must equal HEADS_KV")
rng = np.random.default_rng(1)
def tensor():
    x = rng.standard_normal((1, hq, n, d), dtype=np.float32)
    if name == "bf16":  # round to nearest even in bf16, kept in f32
        b = x.view(np.uint32)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        x = b.view(np.float32)
    return x
q, k, v = tensor(), tensor(), tensor()
params = [ops.parameter([1, hq, n, d], ov.Type.f32, name=x) for x in "qkv"]
sdpa = ops.scaled_dot_product_attention(*params, causal=bool(causal))
model = ov.Model([sdpa], params)
config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
          "INFERENCE_PRECISION_HINT": "bf16" if name == "bf16" else "f32"}
compiled = ov.Core().compile_model(model, "CPU", config)
request = compiled.create_infer_request()
s = []
for r in range(repeats + 1):
    t0 = time.perf_counter()
    request.infer({0: q, 1: k, 2: v})
    if r > 0:
        s.append(time.perf_counter() - t0)
s.sort()
flops = 4.0 * hq * n * n * d / (2 if causal else 1)
print(f"openvino {name} N {n} d {d} H {hq}/{hkv} {'causal' if causal else 'full  '} threads {threads:2d}: "
      f"GFLOP/s median {flops / s[len(s) // 2] * 1e-9:7.1f} min {flops / s[-1] * 1e-9:7.1f} max {flops / s[0] * 1e-9:7.1f}")
