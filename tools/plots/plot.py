#!/usr/bin/python3
"""Draws dsinfer's figures with matplotlib from the data the commands write.

  tools/plots/plot.py DATA.json OUT.svg|OUT.png
  tools/plots/plot.py --loss-tsv RUN/loss.tsv --bigram NATS OUT.json

DATA.json is one of
- a figure of bench/sim_figures: {"kind": "lines" | "bars", "title", "x_label",
  "y_label", "log_x", "categories" (bars), "y_min", "y_max" (optional),
  "ref_lines": [{"label", "y"}], "series": [{"name", "x", "y"}]};
- a report of `dsinfer bench serve --out-json` (it has "runs"): latency and
  throughput against concurrency (or request rate when the rates differ);
- a training loss curve, {"kind": "loss", "bigram_nats", "tokens", "loss",
  "mtp_loss"} (per step), which the second form writes from a trainer's loss.tsv.

The output is deterministic (fixed SVG ids, no date), so redrawing unchanged data
leaves the file unchanged; text stays text in the SVG. scripts/figures.sh redraws
every figure in docs/ and bench/figures/.
"""
import argparse
import csv
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

plt.rcParams.update({
    "svg.hashsalt": "dsinfer",  # stable ids: the same data gives the same bytes
    "svg.fonttype": "none",     # text as <text>: searchable, small
    "font.family": "sans-serif",
    "font.size": 10,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
})

FIGSIZE = (8.0, 4.2)  # inches; the legend goes right of the axes and widens the figure
REF_COLOR = "#555555"
REF_STYLES = ["--", ":", "-."]  # tells reference lines apart when the legend names them


def legend_outside(ax):
    """Legend right of the axes: it never covers data and is never cut (bbox tight)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    # Data first, then the reference lines the legend names (stable order otherwise).
    order = sorted(range(len(handles)), key=lambda i: getattr(handles[i], "get_color",
                                                              lambda: None)() == REF_COLOR)
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def data_hit(ax, renderer):
    """A test of whether a display-space box covers data: bars, or any point of the lines
    drawn so far (sampled every 2 pixels along each segment)."""
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    pts = []
    for line in ax.lines:
        xy = line.get_transform().transform(line.get_xydata())
        for (x0, y0), (x1, y1) in zip(xy, xy[1:]):
            n = max(1, int(math.hypot(x1 - x0, y1 - y0) / 2))
            pts += [(x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n) for i in range(n + 1)]
        if len(xy) == 1:
            pts.append(tuple(xy[0]))

    def hit(box):
        return any(box.overlaps(b) for b in bars) or \
            any(box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1 for x, y in pts)
    return hit


def draw_ref_lines(ax, refs):
    """Horizontal reference lines, each labelled just above or below it where the label
    covers no data and no other text (right, left, middle of the axes; above, then below);
    a line with no such place is named in the legend instead, by its line style."""
    if not refs:
        return
    refs = sorted(refs, key=lambda r: r["y"])
    lo, hi = ax.get_ylim()
    ys = [r["y"] for r in refs]
    ax.set_ylim(min(lo, min(ys) - 0.02 * (hi - lo)), max(hi, max(ys) + 0.06 * (hi - lo)))
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    covers_data = data_hit(ax, renderer)
    placed = [t.get_window_extent(renderer) for t in ax.texts]  # e.g. the bars' values
    trans = blended_transform_factory(ax.transAxes, ax.transData)
    places = [(x, ha, dy) for x, ha in ((0.995, "right"), (0.005, "left"), (0.5, "center"),
                                        (0.75, "center"), (0.25, "center"))
              for dy in (3, -3)]
    ref_px = [ax.transData.transform((0, r["y"]))[1] for r in refs]
    for i, r in enumerate(refs):
        style = REF_STYLES[i % len(REF_STYLES)]
        others = ref_px[:i] + ref_px[i + 1:]
        for place in places:
            label = ref_label(ax, trans, r, place)
            box = label.get_window_extent(renderer)
            if box.y0 >= frame.y0 and box.y1 <= frame.y1 and not covers_data(box) and \
                    not any(box.overlaps(p) for p in placed) and \
                    not any(box.y0 <= y <= box.y1 for y in others):
                placed.append(box)
                ax.axhline(r["y"], color=REF_COLOR, linestyle=style, linewidth=1.0, zorder=1)
                break
            label.remove()
        else:
            ax.axhline(r["y"], color=REF_COLOR, linestyle=style, linewidth=1.0, zorder=1,
                       label=r["label"])


def ref_label(ax, trans, ref, place):
    x, ha, dy = place
    return ax.annotate(ref["label"], xy=(x, ref["y"]), xycoords=trans, xytext=(0, dy),
                       textcoords="offset points", ha=ha, va="bottom" if dy > 0 else "top",
                       fontsize=8.5, color=REF_COLOR, zorder=3)


def draw_lines(fig_data):
    fig, ax = plt.subplots(figsize=FIGSIZE)
    for s in fig_data["series"]:
        many = len(s["x"]) > 40
        ax.plot(s["x"], s["y"], label=s["name"], linewidth=1.4,
                marker=None if many else "o", markersize=3.5)
    if fig_data.get("log_x"):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    return fig, ax


def draw_bars(fig_data):
    fig, ax = plt.subplots(figsize=FIGSIZE)
    cats = fig_data["categories"]
    n = max(len(fig_data["series"]), 1)
    width = 0.8 / n
    for k, s in enumerate(fig_data["series"]):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(s["y"]))]
        bars = ax.bar(xs, s["y"], width * 0.92, label=s["name"], zorder=2)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_xticks(range(len(cats)), cats)
    ax.grid(axis="x", visible=False)
    ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    return fig, ax


def figure_of(fig_data):
    """A sim_figures figure: lines or grouped bars, reference lines, legend outside."""
    fig, ax = (draw_bars if fig_data["kind"] == "bars" else draw_lines)(fig_data)
    ax.set_title(fig_data.get("title", ""))
    ax.set_xlabel(fig_data.get("x_label", ""))
    ax.set_ylabel(fig_data.get("y_label", ""))
    ax.set_ylim(bottom=fig_data.get("y_min"), top=fig_data.get("y_max"))
    fig.tight_layout()  # the axes' final size, for the reference labels' spacing
    draw_ref_lines(ax, fig_data.get("ref_lines", []))
    legend_outside(ax)
    return fig


def serve_figure(report):
    """Two panels of a `bench serve` sweep: latency percentiles and token throughput."""
    runs = report["runs"]
    rates = {str(r["request_rate"]) for r in runs}
    by_rate = len(rates) > 1
    xs = [math.inf if r["request_rate"] == "inf" else r["request_rate"] for r in runs] \
        if by_rate else [r["concurrency"] for r in runs]
    finite = sorted({x for x in xs if math.isfinite(x) and x > 0})
    inf_x = 2 * finite[-1] if finite else 1  # an unpaced run ("inf") right of the others
    ticks = finite + ([inf_x] if math.inf in xs else [])
    tick_labels = [f"{x:g}" for x in finite] + (["inf"] if math.inf in xs else [])
    xs = [inf_x if x == math.inf else x for x in xs]
    x_label = "request rate (/s)" if by_rate else "concurrency (max requests in flight)"
    fig, (lat, thr) = plt.subplots(2, 1, figsize=(FIGSIZE[0], 7.0), sharex=True)
    metrics = (("ttft_ms", "TTFT", "C0"), ("tpot_ms", "TPOT", "C1"), ("itl_ms", "ITL", "C2"))
    for key, name, color in metrics:
        for pct, style in (("p50", "-"), ("p99", "--")):
            lat.plot(xs, [r[key][pct] for r in runs], style, color=color, marker="o",
                     markersize=3.5, label=f"{name} {pct}")
    lat.set_ylabel("latency (ms)")
    lat.set_yscale("log")
    lat.set_title(report.get("label", "bench serve"))
    thr.plot(xs, [r["output_token_throughput"] for r in runs], marker="o", markersize=3.5,
             label="output tokens/s")
    thr.plot(xs, [r["total_token_throughput"] for r in runs], marker="o", markersize=3.5,
             label="prompt + output tokens/s")
    thr.set_ylabel("throughput (tokens/s)")
    thr.set_xlabel(x_label)
    thr.yaxis.set_major_locator(ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    thr.set_ylim(bottom=0)
    if ticks and ticks[-1] / ticks[0] >= 8:
        thr.set_xscale("log", base=2)
    # The measured points are the ticks: 1, 16, 64, 256 rather than powers of two.
    thr.set_xticks(ticks, tick_labels)
    thr.xaxis.set_minor_locator(ticker.NullLocator())
    lo, hi = lat.get_ylim()  # two decades or less: label 1, 2 and 5 of each decade
    subs = (1.0, 2.0, 5.0) if math.log10(hi / lo) <= 2 else (1.0,)
    lat.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    lat.yaxis.set_minor_formatter(ticker.NullFormatter())
    lat.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,g}"))
    for ax in (lat, thr):
        legend_outside(ax)
    fig.tight_layout()
    return fig


def smooth(v, k=10):
    out = []
    for i in range(len(v)):
        w = v[max(0, i - k + 1):i + 1]
        out.append(sum(w) / len(w))
    return out


def loss_figure(d):
    """Main and MTP loss (smoothed over 10 steps) against training tokens."""
    toks, t = [], 0
    for n in d["tokens"]:
        t += n
        toks.append(t / 1e6)
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.plot(toks, smooth(d["loss"]), label="main head", linewidth=1.4)
    ax.plot(toks, smooth(d["mtp_loss"]), label="MTP head (token after next)", linewidth=1.4)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("nats / produced token")
    ax.set_title(d.get("title", "Default model: training loss (mean of the last 10 steps)"))
    ax.set_xlim(0, toks[-1] if toks else 1)
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=10, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_locator(ticker.MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))
    fig.tight_layout()
    if d.get("bigram_nats"):
        draw_ref_lines(ax, [{"label": f"bigram baseline {d['bigram_nats']:.2f}",
                             "y": d["bigram_nats"]}])
    legend_outside(ax)
    return fig


def figure_for(data):
    if "runs" in data:
        return serve_figure(data)
    if data.get("kind") == "loss":
        return loss_figure(data)
    return figure_of(data)


def save(fig, path):
    meta = {"Date": None} if path.endswith(".svg") else {}
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1, metadata=meta, dpi=110)
    plt.close(fig)


def loss_data(tsv, bigram):
    """A trainer's loss.tsv as figure data. A resumed run repeats the steps after its
    checkpoint; the last row of a step is the one the model kept."""
    rows = {}
    for r in csv.DictReader(open(tsv), delimiter="\t"):
        rows[int(r["step"])] = r
    steps = sorted(rows)
    return {"kind": "loss", "bigram_nats": bigram,
            "step": steps,
            "tokens": [int(rows[s]["tokens"]) for s in steps],
            "loss": [float(rows[s]["loss"]) for s in steps],
            "mtp_loss": [float(rows[s]["mtp_loss"]) for s in steps]}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", help="figure data (.json)")
    ap.add_argument("out", help=".svg or .png to draw; with --loss-tsv, the .json to write")
    ap.add_argument("--loss-tsv", help="convert a trainer's loss.tsv into figure data")
    ap.add_argument("--bigram", type=float, help="with --loss-tsv: the bigram baseline (nats)")
    a = ap.parse_args(argv)
    if a.loss_tsv:
        with open(a.out, "w") as f:
            json.dump(loss_data(a.loss_tsv, a.bigram), f, separators=(",", ":"))
            f.write("\n")
        return 0
    if not a.data:
        ap.error("DATA.json is required")
    with open(a.data) as f:
        data = json.load(f)
    save(figure_for(data), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
