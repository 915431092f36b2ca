#!/usr/bin/python3
"""Loss curve of a training run as a plain SVG (no plotting library needed).

  tools/train/plot_loss.py RUN/loss.tsv OUT.svg [--bigram NATS]

Plots the main and MTP losses (nats per produced token, smoothed over 10 steps)
against training tokens; --bigram draws the bigram baseline as a dashed line.
"""
import argparse
import csv


def smooth(v, k=10):
    out = []
    for i in range(len(v)):
        w = v[max(0, i - k + 1):i + 1]
        out.append(sum(w) / len(w))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tsv")
    ap.add_argument("out")
    ap.add_argument("--bigram", type=float)
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.tsv), delimiter="\t"))
    toks, t = [], 0
    for r in rows:
        t += int(r["tokens"])
        toks.append(t)
    series = {"loss": smooth([float(r["loss"]) for r in rows]),
              "mtp_loss": smooth([float(r["mtp_loss"]) for r in rows])}
    W, H, L, B = 640, 360, 60, 40
    ymax = max(max(v) for v in series.values())
    xmax = max(toks[-1], 1)

    def xy(x, y):
        return L + (W - L - 20) * x / xmax, 20 + (H - 20 - B) * (1 - y / ymax)

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for i in range(6):
        y = ymax * i / 5
        _, py = xy(0, y)
        svg.append(f'<line x1="{L}" y1="{py:.1f}" x2="{W - 20}" y2="{py:.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{L - 6}" y="{py + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for i in range(6):
        x = xmax * i / 5
        px, _ = xy(x, 0)
        svg.append(f'<text x="{px:.1f}" y="{H - B + 16}" text-anchor="middle">{x / 1e6:.2f}M</text>')
    svg.append(f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle">training tokens</text>')
    svg.append(f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" '
               f'text-anchor="middle">nats / produced token</text>')
    colors = {"loss": "#1f77b4", "mtp_loss": "#ff7f0e"}
    for k, v in series.items():
        pts = " ".join("%.1f,%.1f" % xy(x, y) for x, y in zip(toks, v))
        svg.append(f'<polyline fill="none" stroke="{colors[k]}" stroke-width="1.5" points="{pts}"/>')
    if a.bigram:
        _, py = xy(0, a.bigram)
        svg.append(f'<line x1="{L}" y1="{py:.1f}" x2="{W - 20}" y2="{py:.1f}" stroke="#2ca02c" '
                   f'stroke-dasharray="5,4"/>')
    legend = [("main head", colors["loss"]), ("MTP head (token after next)", colors["mtp_loss"])]
    if a.bigram:
        legend.append((f"bigram baseline {a.bigram:.2f}", "#2ca02c"))
    for i, (name, c) in enumerate(legend):
        svg.append(f'<rect x="{W - 230}" y="{26 + 16 * i}" width="12" height="3" fill="{c}"/>')
        svg.append(f'<text x="{W - 212}" y="{31 + 16 * i}">{name}</text>')
    svg.append("</svg>")
    open(a.out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
