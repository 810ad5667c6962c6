"""Run the benchmark suite (or read its JSON results) and write one self-contained HTML
report: for every scenario the samples of the baseline and of each variant (roar-core, and
roar-cli when a venv of it is given), their medians, and what roar adds with its spread.

    bench/report [--quick] [--only core,snakemake,ray,airflow] [--roar-cli-venv V]
                 [--tmp TMPFS] [--results DIR] [-o bench/results/report.html]
    bench/report --from DIR [-o OUT]         # chart results already there, run nothing

Each benchmark writes its raw numbers (bench/results.py) into DIR (default
bench/results/<date>/), then the page is written; it has no scripts, fonts or images
from elsewhere.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (script, arguments: full, quick)
SUITE: dict[str, tuple[str, list[str], list[str]]] = {
    "core": ("bench_core.py", ["--reps", "7"], ["--reps", "3", "--files", "0,1000"]),
    "snakemake": ("bench_snakemake.py", ["--reps", "3"], ["--reps", "2", "--jobs", "100",
                                                          "--no-wrapped"]),
    "ray": ("bench_ray.py", ["--rounds", "2"], ["--rounds", "1", "--tasks", "400",
                                                "--trivial", "800", "--wrapped", "200",
                                                "--roar-cli-tasks", "100"]),
    "airflow": ("bench_airflow.py", ["--runs", "3"], ["--runs", "2", "--subprocess-runs",
                                                      "1"]),
    "s3": ("bench_s3.py", [], ["--batches", "10", "--starts", "30"]),
}
PEER_AWARE = {"core", "ray"}
TMP_AWARE = {"core", "ray"}


def run_suite(args: argparse.Namespace, out: Path) -> list[Path]:
    written = []
    for name in args.only:
        script, full, quick = SUITE[name]
        dest = out / f"{name}.json"
        cmd = [sys.executable, str(HERE / script), *(quick if args.quick else full),
               "--json", str(dest)]
        if name in TMP_AWARE and args.tmp:
            cmd += ["--tmp", args.tmp]
        if args.roar_cli_venv and name in PEER_AWARE:
            cmd += ["--roar-cli-venv", args.roar_cli_venv]
        print(f"report: {' '.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with open(out / f"{name}.log", "w") as log:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
        took = time.monotonic() - t0
        if done.returncode not in (0, 1) or not dest.exists():  # 1: a limit not met
            print(f"report: {name} failed ({done.returncode}) after {took:.0f} s, see "
                  f"{out / (name + '.log')}", file=sys.stderr)
            continue
        print(f"report: {name} done in {took:.0f} s", file=sys.stderr)
        written.append(dest)
    return written


# ---------------------------------------------------------------------------------------------
# The page

_COLORS = {"baseline": "#888888", 0: "#3367d6", 1: "#c5221f", 2: "#188038", 3: "#e37400"}
_ROW_H, _LEFT, _RIGHT, _TOP = 26, 300, 440, 30
_PLOT_W = 460


def _fmt(x: float) -> str:
    return f"{x:,.3f}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def _nice_max(x: float) -> float:
    """The axis' end: the first of 1, 2, 2.5, 5, 10 times a power of ten reaching x."""
    if x <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(x))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= x)


def _signed(x: float) -> str:
    return f"{x:+,.0f}" if abs(x) >= 100 else f"{x:+.3g}"


def _added(base: list[float], samples: list[float]) -> tuple[float, float, float]:
    """What the variant adds: the difference of the medians, and the quartiles of each
    sample's difference from the baseline's median (the spread of the figure)."""
    b = statistics.median(base)
    diffs = sorted(x - b for x in samples)
    if len(diffs) >= 2:
        q = statistics.quantiles(diffs, n=4, method="inclusive")
        return statistics.median(samples) - b, q[0], q[2]
    return diffs[0], diffs[0], diffs[0]


def chart(sc: dict) -> str:
    rows = ([("baseline", sc["baseline"]["label"], sc["baseline"]["samples"])]
            if sc.get("baseline") else [])
    rows += [(i, v["label"], v["samples"]) for i, v in enumerate(sc["variants"])]
    rows = [r for r in rows if r[2]]
    top = _nice_max(max(max(r[2]) for r in rows) * 1.05)
    height = _TOP + len(rows) * _ROW_H + 28
    width = _LEFT + _PLOT_W + _RIGHT
    medians = [statistics.median(r[2]) for r in rows]
    # Medians orders of magnitude apart (roar-core against roar-cli): a log axis, on which
    # the smaller ones keep their spread visible.
    log = min(medians) > 0 and max(medians) / min(medians) > 30
    bottom = 10 ** math.floor(math.log10(min(min(r[2]) for r in rows))) if log else 0.0

    def x(v: float) -> float:
        if log:
            return _LEFT + _PLOT_W * math.log10(max(v, bottom) / bottom) / math.log10(
                top / bottom)
        return _LEFT + _PLOT_W * v / top

    ticks = ([bottom * 10 ** k for k in range(round(math.log10(top / bottom)) + 1)] if log
             else [top * k / 5 for k in range(6)])

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
           'font-size="12">']
    for v in ticks:
        out.append(f'<line x1="{x(v):.1f}" y1="{_TOP - 8}" x2="{x(v):.1f}" '
                   f'y2="{height - 24}" stroke="#e0e0e0"/>'
                   f'<text x="{x(v):.1f}" y="{height - 8}" text-anchor="middle" '
                   f'fill="#555">{v:g}</text>')
    out.append(f'<text x="{_LEFT + _PLOT_W:.0f}" y="{_TOP - 14}" text-anchor="end" '
               f'fill="#555">{html.escape(sc["unit"])}{" (log scale)" if log else ""}</text>')
    base = sc["baseline"]["samples"] if sc.get("baseline") else None
    for r, (kind, label, samples) in enumerate(rows):
        cy = _TOP + r * _ROW_H + _ROW_H / 2
        color = _COLORS.get(kind, "#3367d6")
        med = statistics.median(samples)
        out.append(f'<text x="{_LEFT - 10}" y="{cy + 4:.1f}" text-anchor="end">'
                   f'{html.escape(label)}</text>')
        out.append(f'<line x1="{x(min(samples)):.1f}" y1="{cy:.1f}" x2="{x(max(samples)):.1f}" '
                   f'y2="{cy:.1f}" stroke="{color}" stroke-width="1.5"/>')
        for s in samples:
            out.append(f'<circle cx="{x(s):.1f}" cy="{cy:.1f}" r="3.2" fill="{color}" '
                       f'fill-opacity="0.45"><title>{_fmt(s)} {html.escape(sc["unit"])}'
                       '</title></circle>')
        out.append(f'<line x1="{x(med):.1f}" y1="{cy - 8:.1f}" x2="{x(med):.1f}" '
                   f'y2="{cy + 8:.1f}" stroke="{color}" stroke-width="3"/>')
        text = f"median {_fmt(med)}"
        if base and kind != "baseline":
            add, lo, hi = _added(base, samples)
            pct = 100 * add / statistics.median(base) if statistics.median(base) else 0
            text += f" · adds {_signed(add)} ({pct:+.0f}%), IQR {_signed(lo)}…{_signed(hi)}"
        out.append(f'<text x="{_LEFT + _PLOT_W + 12}" y="{cy + 4:.1f}" fill="#333">'
                   f'{html.escape(text)} (n={len(samples)})</text>')
    out.append("</svg>")
    return "\n".join(out)


_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 2em; color: #222; max-width: 1250px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2.2em; } h3 { font-size: 1em; }
.note, .machine { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; margin-top: 1em; }
th, td { text-align: left; padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""


def page(docs: list[dict]) -> str:
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>roar-core benchmarks</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        "<h1>roar-core: what observing lineage costs</h1>\n"
        "<p>Every scenario is measured against its baseline in the same run, interleaved. "
        "Dots are samples, the thick tick is the median, the line spans min to max; "
        "“adds” is the median's difference from the baseline's, with the interquartile "
        "range of each sample's difference. Made by <code>bench/report</code>.</p>\n"]
    summary = []
    for doc in docs:
        m = doc["machine"]
        parts.append(f"<h2>{html.escape(doc['title'])}</h2>\n<p class=\"machine\">"
                     f"{html.escape(str(m.get('date')))}: {m.get('cpus')} CPUs "
                     f"({html.escape(str(m.get('cpu')))}), Python {m.get('python')}, "
                     f"kernel {html.escape(str(m.get('kernel')))}, load "
                     f"{m.get('load')} at the end</p>\n")
        for sc in doc["scenarios"]:
            if not any(v["samples"] for v in sc["variants"]):
                continue
            parts.append(f"<h3>{html.escape(sc['name'])}</h3>\n")
            if sc.get("note"):
                parts.append(f"<p class=\"note\">{html.escape(sc['note'])}</p>\n")
            parts.append(chart(sc) + "\n")
            base = sc["baseline"]["samples"] if sc.get("baseline") else None
            for v in sc["variants"]:
                if not v["samples"]:
                    continue
                med = statistics.median(v["samples"])
                add = _added(base, v["samples"])[0] if base else None
                summary.append((sc["name"], v["label"], sc["unit"],
                                statistics.median(base) if base else None, med, add))
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{html.escape(label)}</td>"
        f"<td class=\"num\">{'' if b is None else _fmt(b)}</td><td class=\"num\">{_fmt(m)}</td>"
        f"<td class=\"num\">{'' if a is None else _signed(a)}</td>"
        f"<td class=\"num\">{'' if a is None or not b else f'{m / b:.3f}'}</td>"
        f"<td>{html.escape(u)}</td></tr>"
        for n, label, u, b, m, a in summary)
    parts.insert(1, "<h2>Summary (medians)</h2>\n<table><tr><th>scenario</th><th>variant</th>"
                    "<th>baseline</th><th>variant</th><th>adds</th><th>ratio</th>"
                    f"<th>unit</th></tr>{rows}</table>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", help="chart the JSON results in this directory")
    ap.add_argument("--results", help="where the runs write their JSON (default: "
                                      "bench/results/<date>)")
    ap.add_argument("--only", default=",".join(SUITE), help="which benchmarks to run")
    ap.add_argument("--quick", action="store_true", help="fewer reps: ~10 minutes")
    ap.add_argument("--roar-cli-venv", default=os.environ.get("ROAR_CLI_VENV"))
    # On a disk, the store's fsync flushes (the journal's commit) every file a run just
    # wrote, and the untraced run after it pays for that: a tmpfs of its own keeps the
    # figures about roar.  Not /dev/shm, nor anything under /dev, /run, /sys: those are
    # never lineage, so the traced runs would record nothing.
    ap.add_argument("--tmp", help="where the core and Ray benchmarks keep their data "
                                   "(a tmpfs mount, e.g. mount -t tmpfs tmpfs /tmp/b)")
    ap.add_argument("-o", "--output", default=None, help="the HTML file (default: "
                                                          "report.html beside the results)")
    args = ap.parse_args()
    args.only = [x for x in args.only.split(",") if x]
    unknown = set(args.only) - set(SUITE)
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(sorted(unknown))} "
                 f"(known: {', '.join(SUITE)})")
    if args.source:
        out = Path(args.source)
        files = sorted(out.glob("*.json"))
        if not files:
            ap.error(f"no *.json results in {out}")
    else:
        out = Path(args.results or HERE / "results" / time.strftime("%Y%m%d-%H%M%S"))
        out.mkdir(parents=True, exist_ok=True)
        files = run_suite(args, out)
    docs = []
    for f in files:
        try:
            doc = json.loads(f.read_text())
            if "scenarios" in doc:
                docs.append(doc)
        except (OSError, ValueError) as e:
            print(f"report: skipping {f}: {e}", file=sys.stderr)
    order = {name: i for i, name in enumerate(SUITE)}
    docs.sort(key=lambda d: order.get(d.get("bench"), 99))
    dest = Path(args.output) if args.output else out / "report.html"
    dest.write_text(page(docs))
    print(f"report: wrote {dest} ({len(docs)} benchmark(s))")
    return 0 if docs else 1


if __name__ == "__main__":
    raise SystemExit(main())
