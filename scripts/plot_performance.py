#!/usr/bin/env python3
"""scripts/plot_performance.py: turns bench_gap's JSON into docs/figures/forward_gap.svg.

One group of bars per workload (tileattn, standard attention on OpenBLAS, on Eigen), in
GFLOP/s, with the machine's ceilings measured in the same run drawn across: the
register-resident FMA loop and OpenBLAS sgemm 2048^3 (both from the JSON's "context").

    build/benchmarks/bench_gap --benchmark_out=gap.json --benchmark_out_format=json
    python3 scripts/plot_performance.py gap.json docs/figures/forward_gap.svg
Standard library only.
"""
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_io import text  # noqa: E402  (the same SVG text helper as the IO figure)

KINDS = [("fwd_tileattn", "tileattn", "#1f77b4"), ("std_blas", "standard, OpenBLAS", "#ff7f0e"),
         ("std_eigen", "standard, Eigen", "#2ca02c")]
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 860, 440, 70, 20, 50, 90


def read(path):
    data = json.loads(Path(path).read_text())
    context = data["context"]
    rates = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration" or "GFLOP/s" not in b:
            continue
        kind, shape = b["name"].split("/", 1)
        shape = re.split(r"/(min_time|iterations|real_time)", shape)[0]
        rates.setdefault(shape, {})[kind] = b["GFLOP/s"]
    ceilings = {"FMA loop": float(context["fma_peak_gflops"]),
                "sgemm 2048^3": float(context["sgemm_2048_gflops"])}
    return rates, ceilings, context


def render(rates, ceilings, context):
    top = max(max(ceilings.values()), max(v for r in rates.values() for v in r.values())) * 1.1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    y = lambda v: TOP + plot_h * (1 - v / top)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           text(WIDTH / 2, 24, f"Forward pass, fp32, B=1, H=16, {context.get('threads', '?')} threads: GFLOP/s "
                f"(useful FLOPs; causal counts the visible half)", 15)]
    step = 100 if top > 300 else 50
    for v in range(0, int(top) + 1, step):
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(text(LEFT - 8, y(v) + 4, str(v), 12, "end"))
    group_w = plot_w / len(rates)
    bar_w = group_w * 0.8 / len(KINDS)
    for g, (shape, by_kind) in enumerate(rates.items()):
        x0 = LEFT + g * group_w + group_w * 0.1
        for k, (kind, _, color) in enumerate(KINDS):
            if kind in by_kind:
                v = by_kind[kind]
                out.append(f'<rect x="{x0 + k * bar_w:.1f}" y="{y(v):.1f}" width="{bar_w - 2:.1f}" '
                           f'height="{y(0) - y(v):.1f}" fill="{color}"/>')
                out.append(text(x0 + (k + 0.5) * bar_w, y(v) - 4, f"{v:.0f}", 10))
        label = shape.replace("/", " ").replace("causal:1", "causal").replace("causal:0", "")
        out.append(text(x0 + group_w * 0.4, HEIGHT - BOTTOM + 18, label.strip(), 12))
    for name, v in ceilings.items():
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#c00" stroke-dasharray="6 4"/>')
        out.append(text(WIDTH - RIGHT - 4, y(v) - 5, f"{name}: {v:.0f}", 12, "end", ' fill="#c00"'))
    for k, (_, label, color) in enumerate(KINDS):
        x = LEFT + k * 220
        out.append(f'<rect x="{x}" y="{HEIGHT - 40}" width="14" height="14" fill="{color}"/>')
        out.append(text(x + 20, HEIGHT - 28, label, 13, "start"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    rates, ceilings, context = read(argv[1])
    Path(argv[2]).write_text(render(rates, ceilings, context))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
