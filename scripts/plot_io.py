#!/usr/bin/env python3
# scripts/plot_io.py: draws docs/figures/hbm_bytes.svg (HBM bytes per forward call against N,
# tiled vs standard attention, log-log) from bench_forward's Google Benchmark JSON.
#
#   build/benchmarks/bench_forward --benchmark_filter='causal:0' \
#       --benchmark_min_time=0.01 --benchmark_format=json > /tmp/forward.json
#   python3 scripts/plot_io.py /tmp/forward.json            # -> docs/figures/hbm_bytes.svg
#
# --compare OLD.json adds OLD's tileattn runs as a third, dotted kind of line (for example a
# build with an earlier tile planner), labelled by --compare-label; --label names the
# main file's tileattn runs. docs/figures/hbm_bytes.svg was made with
#   python3 scripts/plot_io.py now.json --label "tileattn, planner Br = M/4d (2ce4507)" \
#       --compare old.json --compare-label "tileattn, earlier planner: Br = d (6241825)"
#
# The byte counts do not depend on timing, so a short --benchmark_min_time is enough.
# Python 3 standard library only: the SVG is written by hand.
"""Plot measured HBM bytes per forward call from bench_forward's JSON output."""

import argparse
import json
import math
import re
import sys
from pathlib import Path

NAME = re.compile(r"^forward_(?P<kind>tileattn|standard)/N:(?P<n>\d+)/d:(?P<d>\d+)/causal:(?P<causal>\d)")
KIND_LABEL = {"tileattn": "tileattn (tiled, counted)", "standard": "standard (Algorithm 0 formula)",
              "compare": "tileattn, earlier build"}
KIND_DASH = {"standard": ' stroke-dasharray="7 5"', "tileattn": "", "compare": ' stroke-dasharray="2 4"'}
KIND_ORDER = ("standard", "compare", "tileattn")
DIM_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]

WIDTH, HEIGHT = 760, 480  # the plot's part; the legend adds rows below
LEGEND_ROW = 20
LEFT, RIGHT, TOP, BOTTOM = 96, 24, 76, 64  # plot-area margins in px


def read_series(path, causal, kinds=("tileattn", "standard"), rename=None):
    """{(head_dim, kind): {N: bytes}} for the runs with the requested causal flag; kinds
    selects which implementations to read, rename maps a kind to the key stored."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    series = {}
    for bench in data.get("benchmarks", []):
        if bench.get("run_type", "iteration") != "iteration":
            continue  # aggregates of --benchmark_repetitions carry the same bytes
        match = NAME.match(bench.get("run_name", bench["name"]))
        if not match or int(match["causal"]) != causal or "HBM_bytes" not in bench:
            continue
        if match["kind"] not in kinds:
            continue
        key = (int(match["d"]), (rename or {}).get(match["kind"], match["kind"]))
        series.setdefault(key, {})[int(match["n"])] = float(bench["HBM_bytes"])
    return series


def si_bytes(value):
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


class LogAxes:
    """Maps (N, bytes) to SVG pixels: log2 along x, log10 along y."""

    def __init__(self, xs, ys):
        self.x_lo, self.x_hi = math.log2(min(xs)), math.log2(max(xs))
        if self.x_lo == self.x_hi:
            self.x_lo, self.x_hi = self.x_lo - 1, self.x_hi + 1
        self.y_lo = math.floor(math.log10(min(ys)))
        self.y_hi = math.ceil(math.log10(max(ys)))
        if self.y_lo == self.y_hi:
            self.y_hi += 1
        self.pad = 0.25  # fraction of an octave left free at each end of the x axis

    def x(self, n):
        lo, hi = self.x_lo - self.pad, self.x_hi + self.pad
        return LEFT + (math.log2(n) - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    def y(self, b):
        return HEIGHT - BOTTOM - (math.log10(b) - self.y_lo) / (self.y_hi - self.y_lo) * (HEIGHT - TOP - BOTTOM)


def text(x, y, s, size=13, anchor="middle", extra=""):
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{s}</text>'


def marker(kind, x, y, color):
    if kind == "tileattn":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>'
    if kind == "compare":
        return (f'<path d="M {x:.1f} {y - 5:.1f} L {x + 5:.1f} {y + 4:.1f} L {x - 5:.1f} {y + 4:.1f} Z" '
                f'fill="white" stroke="{color}" stroke-width="1.5"/>')
    return f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="white" stroke="{color}" stroke-width="2"/>'


def render(series, title, labels):
    xs = sorted({n for points in series.values() for n in points})
    ys = [b for points in series.values() for b in points.values()]
    axes = LogAxes(xs, ys)
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        text(WIDTH / 2, 24, title, size=15, extra=' font-weight="bold"'),
        text(WIDTH / 2, 44, "tileattn: bytes counted per tile load/store (ForwardOptions::io_counts)",
             size=11, extra=' fill="#555"'),
        text(WIDTH / 2, 59, "standard: FlashAttention's Algorithm 0 count, 4 bytes x B*H*(4*N*d + 4*N*N)",
             size=11, extra=' fill="#555"'),
    ]
    # Grid and y ticks: a labelled line per decade, faint lines at 2..9 x the decade.
    for decade in range(axes.y_lo, axes.y_hi + 1):
        y = axes.y(10.0 ** decade)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#ccc"/>')
        out.append(text(left - 8, y + 4, si_bytes(10.0 ** decade), size=12, anchor="end"))
        if decade < axes.y_hi:
            for m in range(2, 10):
                ym = axes.y(m * 10.0 ** decade)
                out.append(f'<line x1="{left}" y1="{ym:.1f}" x2="{right}" y2="{ym:.1f}" stroke="#eee"/>')
    # x ticks: one per measured N (powers of two).
    for n in xs:
        x = axes.x(n)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="black"/>')
        out.append(text(x, bottom + 20, str(n), size=12))
    out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
               'fill="none" stroke="black"/>')
    out.append(text((left + right) / 2, HEIGHT - 22, "sequence length N = seqlen_q = seqlen_k (log scale)"))
    out.append(text(22, (top + bottom) / 2, "HBM bytes per forward call (log scale)",
                    extra=f' transform="rotate(-90 22 {(top + bottom) / 2:.1f})"'))

    dims = sorted({d for d, _ in series})
    color = {d: DIM_COLORS[i % len(DIM_COLORS)] for i, d in enumerate(dims)}
    legend = {d: [] for d in dims}  # one legend column per head_dim
    for d in dims:
        for kind in KIND_ORDER:
            points = series.get((d, kind))
            if not points:
                continue
            coords = [(axes.x(n), axes.y(b)) for n, b in sorted(points.items())]
            dash = KIND_DASH[kind]
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color[d]}" stroke-width="2"{dash}/>')
            out.extend(marker(kind, x, y, color[d]) for x, y in coords)
            legend[d].append((labels[kind], kind, dash))
    # Legend below the x-axis label, so that it never hides a curve.
    rows = 1 + max(len(entries) for entries in legend.values())  # a heading, then the kinds
    column_width = (right - left) / len(dims)
    legend_top = HEIGHT - 2
    for col, d in enumerate(dims):
        lx = left + col * column_width
        out.append(text(lx, legend_top + 4, f"head_dim d = {d}", size=12, anchor="start",
                        extra=f' font-weight="bold" fill="{color[d]}"'))
        for row, (label, kind, dash) in enumerate(legend[d], start=1):
            y = legend_top + row * LEGEND_ROW
            out.append(f'<line x1="{lx:.1f}" y1="{y}" x2="{lx + 34:.1f}" y2="{y}" stroke="{color[d]}" '
                       f'stroke-width="2"{dash}/>')
            out.append(marker(kind, lx + 17, y, color[d]))
            out.append(text(lx + 42, y + 4, label, size=11, anchor="start"))
    total_height = HEIGHT + rows * LEGEND_ROW + 8
    out[0] = out[0].replace(f'height="{HEIGHT}"', f'height="{total_height}"').replace(
        f'0 0 {WIDTH} {HEIGHT}', f'0 0 {WIDTH} {total_height}')
    out[1] = f'<rect width="{WIDTH}" height="{total_height}" fill="white"/>'
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", help="Google Benchmark JSON from bench_forward")
    parser.add_argument("-o", "--output", default=str(Path(__file__).resolve().parent.parent / "docs/figures/hbm_bytes.svg"))
    parser.add_argument("--causal", type=int, choices=(0, 1), default=0, help="plot the causal runs (default: non-causal)")
    parser.add_argument("--label", default=KIND_LABEL["tileattn"], help="legend text for the tileattn runs")
    parser.add_argument("--compare", help="a second bench_forward JSON whose tileattn runs are drawn dotted")
    parser.add_argument("--compare-label", default=KIND_LABEL["compare"], help="legend text for --compare")
    args = parser.parse_args(argv)

    series = read_series(args.json, args.causal)
    if args.compare:
        series.update(read_series(args.compare, args.causal, kinds=("tileattn",), rename={"tileattn": "compare"}))
    if not series:
        sys.exit(f"plot_io.py: no forward_* runs with causal:{args.causal} and an HBM_bytes counter in {args.json}")
    title = f"HBM traffic of one forward call (B=1, H=16, fp32, {'causal' if args.causal else 'non-causal'})"
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    labels = dict(KIND_LABEL, tileattn=args.label, compare=args.compare_label)
    Path(args.output).write_text(render(series, title, labels), encoding="utf-8")

    # The numbers behind the figure, for docs/design.md.
    print(f"{'d':>4} {'kind':>9} " + " ".join(f"{'N=' + str(n):>12}" for n in sorted({n for p in series.values() for n in p})))
    for (d, kind), points in sorted(series.items()):
        print(f"{d:>4} {kind:>9} " + " ".join(f"{points[n] / 2**20:>8.1f} MiB" for n in sorted(points)))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
