#!/usr/bin/env python3
# benchmarks/python/bench_torch.py: tileattn.torch against PyTorch's CPU SDPA
# (torch.nn.functional.scaled_dot_product_attention) in one process, on the same tensors.
#
# What it measures (wall time per call; each repeat times tileattn, then torch, alternating):
#   prefill   causal attention, Hq 32 / Hkv 8 (GQA: SDPA with enable_gqa=True, tileattn natively),
#             d 128, B x N from --shapes (default 1x512, 4x512, 1x2048), float32 and bfloat16,
#             forward (under no_grad) and forward + backward (torch.autograd.grad of q, k, v).
#             Q/K/V are [B, N, H, D] tensors: tileattn.torch.attention takes them as they are,
#             SDPA takes their [B, H, N, D] transposed views, as transformers passes them.
#   decode    1 query token against a contiguous K/V cache in transformers' [B, Hkv, S, D]
#             layout (S from --decode, default 1x4096, 1x16384, 4x4096): SDPA with enable_gqa
#             vs tileattn.torch.attention (causal, bottom-right: every key) on the [B, S, H, D]
#             views of the same memory, and tileattn.torch.forward_paged over a pool of 16-token
#             pages [pages, 16, Hkv, D] reached through a shuffled block table. Caches are warm
#             (the same K/V every call); the three outputs are checked against each other first.
#   overhead  the fixed cost of one call, on a tiny problem (1 query, 16 keys, 1 head, d 16):
#             tileattn._C.forward called directly (DLPack capsules, prebuilt Options, preallocated
#             outputs: the extension and the tiny kernel), the
#             same plus what tileattn.torch's op body adds (Options, outputs), the registered op
#             torch.ops.tileattn.fwd through the dispatcher, tileattn.torch.attention (the public
#             call), the same with inputs that require grad (autograd), SDPA, and the paged decode's
#             forward_paged and PagedDecode.run (options made once, output reused); each path's
#             cost is reported as a fraction of the decode call's time.
# Each repeat runs a call `iters` times (calibrated so that one timing lasts >= --min-time
# seconds) and keeps the mean; the table shows the median and min..max over --repeats repeats,
# and the ratio tileattn / torch as the median (min..max) of the per-repeat ratios (< 1: tileattn
# is faster). Threads: --threads (torch.set_num_threads; tileattn.torch runs on
# torch.get_num_threads()).
#
#   python benchmarks/python/bench_torch.py --threads 2                 # about 1.5 min on 2 idle cores
#   python benchmarks/python/bench_torch.py --threads 2 --quick         # smoke run, under 20 s
#   python benchmarks/python/bench_torch.py --threads 16 --shapes 1x2048,4x2048 --json out.json
# With the package not installed, put python/ on the path: PYTHONPATH=python (run from the root).
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

try:
    import tileattn
    import tileattn.torch as ta
    from tileattn import _C
except ImportError:  # run from a checkout: python/ holds the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tileattn
    import tileattn.torch as ta
    from tileattn import _C

HQ, HKV, D = 32, 8, 128
PAGE = 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------
# Timing

def _mean_call(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _calibrate(fn, min_time: float, warmup: int) -> int:
    for _ in range(warmup):
        fn()
    t = _mean_call(fn, 1)
    if t < min_time / 4:  # a better estimate for short calls
        t = _mean_call(fn, max(1, int(min_time / 4 / max(t, 1e-9))))
    return max(1, math.ceil(min_time / max(t, 1e-9)))


def _summary(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1],
            "q1": xs[len(xs) // 4], "q3": xs[(3 * len(xs)) // 4]}


def time_pair(fn_a, fn_b, repeats: int, min_time: float, warmup: int = 1):
    """Times fn_a and fn_b alternately (a, b, a, b, ...): per-call seconds of each repeat and
    the per-repeat ratios a / b."""
    it_a, it_b = _calibrate(fn_a, min_time, warmup), _calibrate(fn_b, min_time, warmup)
    ta_, tb_ = [], []
    for _ in range(repeats):
        ta_.append(_mean_call(fn_a, it_a))
        tb_.append(_mean_call(fn_b, it_b))
    return ta_, tb_, [a / b for a, b in zip(ta_, tb_)], (it_a, it_b)


def time_one(fn, repeats: int, min_time: float, warmup: int = 1):
    it = _calibrate(fn, min_time, warmup)
    return [_mean_call(fn, it) for _ in range(repeats)], it


def _fmt_t(s: float) -> str:
    if s >= 1.0:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_stat(st) -> str:
    return f"{_fmt_t(st['median'])} [{_fmt_t(st['min'])}..{_fmt_t(st['max'])}]"


def _fmt_ratio(st) -> str:
    return f"{st['median']:.3f} [{st['min']:.3f}..{st['max']:.3f}]"


# ----------------------------------------------------------------------------------------------
# Cases

def _randn(shape, dtype, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def prefill_case(B: int, N: int, dtype: torch.dtype, backward: bool, gen):
    """(tileattn call, torch call, max |difference| of the outputs)."""
    q = _randn((B, N, HQ, D), dtype, gen)
    k = _randn((B, N, HKV, D), dtype, gen)
    v = _randn((B, N, HKV, D), dtype, gen)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=True).transpose(1, 2)

    def tile(q, k, v):
        return ta.attention(q, k, v, causal=True)[0]

    with torch.no_grad():
        diff = (tile(q, k, v).float() - sdpa(q, k, v).float()).abs().max().item()
    if not backward:
        def run_t():
            with torch.no_grad():
                tile(q, k, v)

        def run_s():
            with torch.no_grad():
                sdpa(q, k, v)
        return run_t, run_s, diff

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dout = _randn((B, N, HQ, D), dtype, gen)

    def run_t():
        torch.autograd.grad(tile(qg, kg, vg), (qg, kg, vg), dout)

    def run_s():
        torch.autograd.grad(sdpa(qg, kg, vg), (qg, kg, vg), dout)
    return run_t, run_s, diff


def decode_case(B: int, S: int, dtype: torch.dtype, gen):
    """SDPA, tileattn.torch.attention and tileattn.torch.forward_paged on one decode step."""
    q = _randn((B, 1, HQ, D), dtype, gen)                 # [B, 1, Hq, D]
    k_c = _randn((B, HKV, S, D), dtype, gen)              # transformers' cache layout
    v_c = _randn((B, HKV, S, D), dtype, gen)
    k, v = k_c.transpose(1, 2), v_c.transpose(1, 2)      # [B, S, Hkv, D] views, no copy
    # The paged pool: every sequence's pages in a shuffled order (and a few spare pages).
    pages_per_seq = (S + PAGE - 1) // PAGE
    num_pages = B * pages_per_seq + 7
    perm = torch.randperm(num_pages, generator=gen)[:B * pages_per_seq]
    block_table = perm.reshape(B, pages_per_seq).to(torch.int32)
    k_pool = torch.zeros((num_pages, PAGE, HKV, D), dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    padded = pages_per_seq * PAGE
    for src, pool in ((k, k_pool), (v, v_pool)):
        tok = torch.zeros((B, padded, HKV, D), dtype=dtype)
        tok[:, :S] = src
        pool[block_table.long()] = tok.reshape(B, pages_per_seq, PAGE, HKV, D)
    seqlens = torch.full((B,), S, dtype=torch.int32)

    def run_s():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q.transpose(1, 2), k_c, v_c, enable_gqa=True).transpose(1, 2)

    def run_t():
        with torch.no_grad():
            return ta.attention(q, k, v, causal=True)[0]

    def run_p():
        with torch.no_grad():
            return ta.forward_paged(q, k_pool, v_pool, block_table, seqlens, causal=True)[0]

    ref = run_s().float()
    diffs = {"attention": (run_t().float() - ref).abs().max().item(),
             "forward_paged": (run_p().float() - ref).abs().max().item()}
    return run_t, run_p, run_s, diffs


def overhead_calls():
    """Tiny problem: the cost of one call along each path."""
    q = torch.randn(1, 1, 1, 16)
    k = torch.randn(1, 16, 1, 16)
    v = torch.randn(1, 16, 1, 16)
    o = torch.empty(1, 1, 1, 16)
    lse = torch.empty(1, 1, 1)
    opts = _C.Options()
    opts.causal = True
    opts.num_threads = torch.get_num_threads()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    op = torch.ops.tileattn.fwd

    to_dlpack = torch.utils.dlpack.to_dlpack

    def c_direct():  # the extension alone: tensors as DLPack capsules, as tileattn.torch passes them
        _C.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(o), to_dlpack(lse), opts)

    def op_body():  # what tileattn.torch's op body does around _C.forward, without the dispatcher
        o2 = q.new_empty((1, 1, 1, 16))
        lse2 = q.new_empty((1, 1, 1), dtype=torch.float32)
        ta._run(_C.forward, q.detach(), k.detach(), v.detach(), o2, lse2,
                ta._options(None, True, False, -1, -1, 0.0, None, None, None, None))

    def dispatcher():
        with torch.no_grad():
            op(q, k, v, None, True, False, -1, -1, 0.0, None, None, None, None)

    def public():
        with torch.no_grad():
            ta.attention(q, k, v, causal=True)

    def public_grad():
        ta.attention(qg, kg, vg, causal=True)

    def sdpa():
        with torch.no_grad():
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    # The paged decode's two calls on the same tiny problem: 16 keys in one 16-token page.
    k_pool, v_pool = k.reshape(1, 16, 1, 16), v.reshape(1, 16, 1, 16)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.full((1,), 16, dtype=torch.int32)
    decode = ta.PagedDecode()

    def paged():
        with torch.no_grad():
            ta.forward_paged(q, k_pool, v_pool, table, lens)

    def paged_run():
        decode.run(q, k_pool, v_pool, table, lens, out=o)

    return [("_C.forward (direct, prebuilt Options)", c_direct),
            ("+ op body (Options, outputs; no dispatcher)", op_body),
            ("torch.ops.tileattn.fwd (dispatcher)", dispatcher),
            ("tileattn.torch.attention (no_grad)", public),
            ("tileattn.torch.attention (requires_grad)", public_grad),
            ("torch SDPA (no_grad), same tiny shape", sdpa),
            ("tileattn.torch.forward_paged (no_grad)", paged),
            ("tileattn.torch.PagedDecode.run (out reused)", paged_run)]


# ----------------------------------------------------------------------------------------------

def _parse_shapes(s: str):
    out = []
    for item in s.split(","):
        if item.strip():
            b, n = item.lower().split("x")
            out.append((int(b), int(n)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__ or "tileattn.torch vs torch SDPA")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--min-time", type=float, default=0.05, help="seconds one timing lasts at least")
    p.add_argument("--shapes", default="1x512,4x512,1x2048", help="prefill B x N list")
    p.add_argument("--decode", default="1x4096,1x16384,4x4096", help="decode B x S (keys) list")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--skip", default="", help="comma list of sections to skip: prefill,train,decode,overhead")
    p.add_argument("--quick", action="store_true", help="a ~20 s smoke run: small shapes, 3 repeats")
    p.add_argument("--json", default=None, help="write every timing to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 3)
        args.min_time = 0.02
        args.shapes = "1x512"
        args.decode = "1x4096"
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    gen = torch.Generator().manual_seed(0)

    meta = {"threads": torch.get_num_threads(), "torch": torch.__version__, "tileattn": tileattn.__version__,
            "isa": tileattn.active_isa(), "cpu": platform.processor() or platform.machine(),
            "repeats": args.repeats, "min_time_s": args.min_time, "heads_q": HQ, "heads_kv": HKV, "head_dim": D}
    print(f"tileattn {meta['tileattn']} ({meta['isa']}) vs torch {meta['torch']} SDPA, {meta['threads']} threads, "
          f"Hq {HQ} Hkv {HKV} d {D}; median [min..max] of {args.repeats} repeats; ratio = tileattn / torch "
          "(median [min..max] of per-repeat ratios)")
    results = []
    t_start = time.perf_counter()

    hdr = f"{'case':<30} {'tileattn':<32} {'torch SDPA':<32} {'ratio':<22} {'max|diff|':>9}"
    for section, backward in (("prefill", False), ("train", True)):
        if section in skip:
            continue
        title = "forward, causal" if not backward else "forward + backward, causal"
        print(f"\n== {section}: {title}\n{hdr}")
        for dname in dtypes:
            for B, N in _parse_shapes(args.shapes):
                run_t, run_s, diff = prefill_case(B, N, DTYPES[dname], backward, gen)
                tt, ts, r, iters = time_pair(run_t, run_s, args.repeats, args.min_time)
                st, ss, sr = _summary(tt), _summary(ts), _summary(r)
                case = f"{dname} B{B} N{N}"
                print(f"{case:<30} {_fmt_stat(st):<32} {_fmt_stat(ss):<32} {_fmt_ratio(sr):<22} {diff:>9.2e}",
                      flush=True)
                results.append({"section": section, "dtype": dname, "B": B, "N": N, "tileattn_s": tt, "torch_s": ts,
                                "ratio": r, "iters": iters, "max_abs_diff_out": diff,
                                "tileattn": st, "torch": ss, "ratio_summary": sr})

    decode_times = {}
    if "decode" not in skip:
        print(f"\n== decode: 1 query token, contiguous K/V [B, Hkv, S, D] (and a 16-token paged pool)\n{hdr}")
        for dname in dtypes:
            for B, S in _parse_shapes(args.decode):
                run_t, run_p, run_s, diffs = decode_case(B, S, DTYPES[dname], gen)
                for label, fn in (("attention", run_t), ("forward_paged", run_p)):
                    tt, ts, r, iters = time_pair(fn, run_s, args.repeats, args.min_time)
                    st, ss, sr = _summary(tt), _summary(ts), _summary(r)
                    case = f"{dname} B{B} S{S} {label}"
                    print(f"{case:<30} {_fmt_stat(st):<32} {_fmt_stat(ss):<32} {_fmt_ratio(sr):<22} "
                          f"{diffs[label]:>9.2e}", flush=True)
                    results.append({"section": "decode", "call": label, "dtype": dname, "B": B, "S": S,
                                    "tileattn_s": tt, "torch_s": ts, "ratio": r, "iters": iters,
                                    "max_abs_diff_out": diffs[label], "tileattn": st, "torch": ss,
                                    "ratio_summary": sr})
                    decode_times[(dname, B, S, label)] = st["median"]
                del run_t, run_p, run_s

    overhead = {}
    if "overhead" not in skip:
        print("\n== per-call overhead: tiny problem (1 query, 16 keys, 1 head, d 16, float32)")
        print(f"{'path':<46} {'per call':<32}")
        for label, fn in overhead_calls():
            ts, it = time_one(fn, args.repeats, max(args.min_time, 0.02), warmup=20)
            s = _summary(ts)
            overhead[label] = {"per_call_s": ts, "summary": s, "iters": it}
            print(f"{label:<46} {_fmt_stat(s):<32}", flush=True)
        direct = overhead["_C.forward (direct, prebuilt Options)"]["summary"]["median"]
        full = overhead["tileattn.torch.attention (no_grad)"]["summary"]["median"]
        extra = full - direct
        print(f"fixed cost of tileattn.torch.attention: {full * 1e6:.1f} us a call, of which {extra * 1e6:.1f} us "
              f"above the direct binding call")
        fractions = []
        for (dname, B, S, label), t in sorted(decode_times.items()):
            if label != "attention":
                continue
            fr = {"dtype": dname, "B": B, "S": S, "decode_s": t, "call_overhead_fraction": full / t,
                  "above_binding_fraction": extra / t}
            fractions.append(fr)
            print(f"  vs decode {dname} B{B} S{S} ({_fmt_t(t)}): {100 * full / t:.2f} % of the call "
                  f"({100 * extra / t:.2f} % above the binding)")
        planned = overhead["tileattn.torch.PagedDecode.run (out reused)"]["summary"]["median"]
        print(f"fixed cost of tileattn.torch.PagedDecode.run: {planned * 1e6:.1f} us a call")
        for (dname, B, S, label), t in sorted(decode_times.items()):
            if label == "forward_paged":
                print(f"  vs decode {dname} B{B} S{S} forward_paged ({_fmt_t(t)}): {100 * planned / t:.2f} % of the call")
                fractions.append({"dtype": dname, "B": B, "S": S, "decode_s": t, "call": "PagedDecode.run",
                                  "call_overhead_fraction": planned / t})
        overhead = {"paths": overhead, "call_s": full, "above_binding_s": extra, "paged_run_s": planned,
                    "vs_decode": fractions}

    total = time.perf_counter() - t_start
    print(f"\n(total {total:.1f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results, "overhead": overhead, "total_s": total}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
