#!/usr/bin/env python3
"""scripts/plot_planner.py: turns benchmarks/planner_sweep's CSV into docs/figures/planner_sweep.svg.

K/V traffic of the tile plan relative to the least any legal plan reads (brute force), against
the GQA group size, at d = 128 and Nq = 1000 (Nk = 3000), one colour per SRAM budget: the
planner (solid) and the FlashAttention rule it replaced (dashed). Counts, not timings.

    build/benchmarks/planner_sweep > sweep.csv
    python3 scripts/plot_planner.py sweep.csv docs/figures/planner_sweep.svg
Standard library only.
"""
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot_io import text  # noqa: E402  (the same SVG text helper as the IO figure)

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 460, 70, 20, 60, 100
BUDGETS = [(48 << 10, "48 KiB", "#d62728"), (128 << 10, "128 KiB", "#ff7f0e"),
           (512 << 10, "512 KiB", "#2ca02c"), (2 << 20, "2 MiB", "#1f77b4")]
HEAD_DIM, SEQLEN_Q = 128, 1000


def read(path):
    series = {}
    for r in csv.DictReader(open(path)):
        if int(r["head_dim"]) != HEAD_DIM or int(r["seqlen_q"]) != SEQLEN_Q:
            continue
        best = int(r["brute_force"])
        point = (int(r["group"]), int(r["planner"]) / best, int(r["fa_rule"]) / best)
        series.setdefault(int(r["budget"]), []).append(point)
    return series


def render(series):
    groups = sorted({g for points in series.values() for g, _, _ in points})
    top = max(max(old for _, _, old in points) for points in series.values()) * 1.08
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x = lambda g: LEFT + plot_w * (g - groups[0]) / (groups[-1] - groups[0])
    y = lambda v: TOP + plot_h * (1 - (v - 1) / (top - 1))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           text(WIDTH / 2, 24, f"K/V bytes of the tile plan / the least any plan that fits reads", 15),
           text(WIDTH / 2, 44, f"d = {HEAD_DIM}, Nq = {SEQLEN_Q}, Nk = 3000, one worker (benchmarks/planner_sweep)", 12)]
    v = 1.0
    while v <= top:
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(text(LEFT - 8, y(v) + 4, f"{v:.1f}x", 12, "end"))
        v += 0.5
    for g in groups:
        out.append(text(x(g), HEIGHT - BOTTOM + 18, str(g), 11))
    out.append(text(LEFT + plot_w / 2, HEIGHT - BOTTOM + 38, "query heads per K/V head (GQA group)", 13))
    for budget, label, color in BUDGETS:
        points = sorted(series.get(budget, []))
        for idx, dash in ((1, ""), (2, ' stroke-dasharray="6 4"')):
            path = " ".join(f"{'M' if i == 0 else 'L'} {x(p[0]):.1f} {y(p[idx]):.1f}" for i, p in enumerate(points))
            out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    for k, (_, label, color) in enumerate(BUDGETS):
        lx = LEFT + k * 150
        out.append(f'<rect x="{lx}" y="{HEIGHT - 44}" width="14" height="14" fill="{color}"/>')
        out.append(text(lx + 20, HEIGHT - 32, f"SRAM {label}", 12, "start"))
    out.append(text(LEFT, HEIGHT - 12, "solid: the planner, at 1.0x everywhere (the lines overlap); dashed: the "
                    "FlashAttention rule it replaced", 11, "start"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    Path(argv[2]).write_text(render(read(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
