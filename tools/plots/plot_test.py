#!/usr/bin/python3
"""Tests of tools/plots/plot.py on small data files (ctest plots_test).

Draws each kind of figure through the command line and checks the SVG: legend text
and reference labels present, every axis's ticks nice numbers (a step of 1, 2, 2.5 or
5 times a power of ten), the same bytes on a second draw; and, in the figure itself,
that no reference label overlaps another and that every text lies inside the saved
image (a legend is not cut off).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plot  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"

LINES = {
    "kind": "lines", "title": "EPLB moe_lb (lower is better)",
    "x_label": "Zipf exponent", "y_label": "moe_lb", "log_x": False, "categories": [],
    "y_min": 1.0, "y_max": 3.0,
    "ref_lines": [{"label": "goal 1.05", "y": 1.05},
                  {"label": "DeepSeek reported 1.090", "y": 1.09}],
    "series": [
        {"name": "no EPLB", "x": [0.2, 0.4, 0.6, 0.8, 1.0], "y": [1.3, 1.6, 2.0, 2.4, 2.9]},
        {"name": "min-max completion (after)", "x": [0.2, 0.4, 0.6, 0.8, 1.0],
         "y": [1.01, 1.02, 1.03, 1.05, 1.08]},
    ],
}
BARS = {
    "kind": "bars", "title": "LB efficiency", "x_label": "", "y_label": "ideal / achieved",
    "log_x": False, "categories": ["mooncake", "azure2023_code", "azure2023_conv"],
    "y_min": 0, "y_max": 1.05,
    "ref_lines": [{"label": "goal 0.90", "y": 0.9},
                  {"label": "DeepSeek reported ~0.80", "y": 0.8}],
    "series": [{"name": "deepseek", "x": [0, 1, 2], "y": [0.93, 0.88, 0.91]},
               {"name": "round-robin", "x": [0, 1, 2], "y": [0.71, 0.66, 0.69]}],
}
# A time series whose data range (0 .. 133) gave the old plotter ticks 26.6, 53.2, 79.8.
TIMELINE = {
    "kind": "lines", "title": "busy share", "x_label": "simulated time (s)",
    "y_label": "busy share", "log_x": False, "categories": [], "ref_lines": [],
    "series": [{"name": "proportional (before)", "x": [i * 1.33 for i in range(101)],
                "y": [0.5 + 0.4 * math.sin(i / 9) for i in range(101)]}],
}


def run_summary(conc, scale):
    stats = {"mean": 10.0 * scale, "p50": 9.0 * scale, "p90": 15.0 * scale, "p99": 20.0 * scale}
    return {"concurrency": conc, "request_rate": "inf", "ttft_ms": stats, "tpot_ms": stats,
            "itl_ms": stats, "output_token_throughput": 5.0 * scale,
            "total_token_throughput": 12.0 * scale}


SERVE = {"label": "dsinfer serve, small preset",
         "runs": [run_summary(c, s) for c, s in ((1, 1), (16, 3), (64, 7), (256, 9))]}


def tick_labels(svg_path):
    """{"x": [...], "y": [...]}: the major tick labels of every axis, in order."""
    root = ET.parse(svg_path).getroot()
    out = {"x": [], "y": []}
    for g in root.iter(SVG + "g"):
        gid = g.get("id", "")
        for axis in ("x", "y"):
            if gid.startswith(axis + "tick_"):
                texts = ["".join(t.itertext()).strip() for t in g.iter(SVG + "text")]
                out[axis] += [t for t in texts if t]
    return out


def texts(svg_path):
    root = ET.parse(svg_path).getroot()
    return ["".join(t.itertext()).strip() for t in root.iter(SVG + "text")]


def number(label):
    return float(label.replace(",", "").replace("\u2212", "-"))


def is_nice_step(step):
    mant = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(abs(mant - m) < 1e-6 for m in (1, 2, 2.5, 5, 10))


class PlotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def draw(self, data, name):
        src = os.path.join(self.dir.name, name + ".json")
        out = os.path.join(self.dir.name, name + ".svg")
        with open(src, "w") as f:
            json.dump(data, f)
        subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), src, out], check=True)
        return out

    def assert_nice_linear(self, labels, what):
        values = [number(v) for v in labels]
        self.assertGreaterEqual(len(values), 3, what)
        steps = [b - a for a, b in zip(values, values[1:])]
        for s in steps:
            self.assertAlmostEqual(s, steps[0], delta=1e-9 * max(1, abs(steps[0])), msg=what)
        self.assertTrue(is_nice_step(steps[0]), f"{what}: step {steps[0]} in {labels}")

    def test_lines_legend_ticks_and_reference_labels(self):
        svg = self.draw(LINES, "lines")
        t = texts(svg)
        for s in ("no EPLB", "min-max completion (after)", "goal 1.05",
                  "DeepSeek reported 1.090", "Zipf exponent", "moe_lb"):
            self.assertIn(s, t)
        ticks = tick_labels(svg)
        self.assert_nice_linear(ticks["x"], "x ticks")
        self.assert_nice_linear(ticks["y"], "y ticks")

    def test_bars_categories_and_reference_labels(self):
        svg = self.draw(BARS, "bars")
        t = texts(svg)
        for s in ("mooncake", "azure2023_conv", "deepseek", "round-robin", "goal 0.90",
                  "DeepSeek reported ~0.80"):
            self.assertIn(s, t)
        self.assert_nice_linear(tick_labels(svg)["y"], "y ticks")

    def test_ticks_nice_on_an_awkward_range(self):
        ticks = tick_labels(self.draw(TIMELINE, "timeline"))
        self.assert_nice_linear(ticks["x"], "x ticks")
        for bad in ("26.6", "53.2", "79.8"):
            self.assertNotIn(bad, ticks["x"])

    def test_serve_report_ticks_are_the_measured_points(self):
        svg = self.draw(SERVE, "serve")
        t = texts(svg)
        for s in ("dsinfer serve, small preset", "TTFT p99", "ITL p50", "output tokens/s",
                  "concurrency (max requests in flight)"):
            self.assertIn(s, t)
        ticks = tick_labels(svg)
        self.assertEqual([v for v in ticks["x"] if v], ["1", "16", "64", "256"])  # shared x

    def test_serve_rate_sweep_puts_unpaced_last(self):
        runs = [dict(run_summary(256, k + 1), request_rate=rate)
                for k, rate in enumerate((2, 8, "inf"))]
        svg = self.draw({"label": "rates", "runs": runs}, "rates")
        self.assertIn("request rate (/s)", texts(svg))
        self.assertEqual([v for v in tick_labels(svg)["x"] if v], ["2", "8", "inf"])

    def test_loss_from_tsv(self):
        tsv = os.path.join(self.dir.name, "loss.tsv")
        with open(tsv, "w") as f:
            f.write("step\tepoch\ttokens\tloss\tmtp_loss\n")
            for step in list(range(1, 41)) + list(range(31, 61)):  # resumed at step 30
                f.write(f"{step}\t0\t1000\t{10 / step:.4f}\t{11 / step:.4f}\n")
        data = os.path.join(self.dir.name, "loss.json")
        subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), "--loss-tsv", tsv,
                        "--bigram", "2.1615", data], check=True)
        with open(data) as f:
            d = json.load(f)
        self.assertEqual(d["step"], list(range(1, 61)))  # a repeated step counts once
        t = texts(self.draw(d, "loss"))
        for s in ("main head", "MTP head (token after next)", "bigram baseline 2.16"):
            self.assertIn(s, t)

    def test_same_bytes_on_a_second_draw(self):
        with open(self.draw(LINES, "a")) as fa, open(self.draw(LINES, "b")) as fb:
            a, b = fa.read(), fb.read()
        self.assertEqual(a, b)
        self.assertNotIn("<dc:date>", a)

    def test_reference_labels_apart_and_all_text_inside_the_image(self):
        for data in (LINES, BARS):
            fig = plot.figure_for(data)
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            ax = fig.axes[0]
            names = {r["label"] for r in data["ref_lines"]}
            inline = [t for t in ax.texts if t.get_text() in names]
            in_legend = [t.get_text() for t in ax.get_legend().get_texts()
                         if t.get_text() in names]
            # Each reference line is named once: beside it, or in the legend.
            self.assertEqual(sorted([t.get_text() for t in inline] + in_legend), sorted(names))
            boxes = [t.get_window_extent(renderer) for t in inline]
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    self.assertFalse(a.overlaps(b), f"{a} overlaps {b}")
            # bbox_inches="tight" grows the saved image to the union of the artists;
            # check that union holds the legend, i.e. nothing is clipped away.
            tight = fig.get_tightbbox(renderer)
            legend = ax.get_legend().get_window_extent(renderer)
            inches = legend.transformed(fig.dpi_scale_trans.inverted())
            self.assertTrue(tight.contains(inches.x0, inches.y0)
                            and tight.contains(inches.x1 - 1e-6, inches.y1 - 1e-6))

    def test_reference_label_covers_no_data(self):
        fig = plot.figure_for(LINES)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        names = {r["label"] for r in LINES["ref_lines"]}
        series = {s["name"] for s in LINES["series"]}
        for t in ax.texts:
            if t.get_text() in names:
                box = t.get_window_extent(renderer)
                for ln in ax.lines:
                    if ln.get_label() in series:
                        xy = ln.get_transform().transform(ln.get_xydata())
                        self.assertFalse(any(box.contains(x, y) for x, y in xy), t.get_text())

if __name__ == "__main__":
    unittest.main()
