#!/usr/bin/env python3
"""Draws a stretch of an `idist-run --trace` file as a PNG (gnuplot), the picture in the README:
one row per rank, each call a box coloured by what it is, the white between boxes the rank's own
work, and an arrow from the rank that entered a collective last to each rank that waited for it.

    python3 scripts/trace_picture.py TRACE.json OUT.png [--from-ms 60] [--ms 40] [--title TEXT]

docs/trace-straggler.png is 30 ms of a job where rank 2's work takes 50% longer:
    METRICS_RANK_SLEEP_MS=5 idist-run -n 4 --trace t.json build/tests/e2e/metrics_rank 40 1 2 50 10
    python3 scripts/trace_picture.py t.json docs/trace-straggler.png --from-ms 120 --ms 30 --title ...

--from-ms: where the stretch starts, from the trace's first call; --ms: how long it is.
A trace opens whole, zoomable, in ui.perfetto.dev or chrome://tracing; this is for a page.
"""
import argparse
import json
import shutil
import subprocess
import sys

COLOURS = ["#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c"]


def label(e):
    b = e["args"].get("bytes", 0)
    size = f"{b // 1024} KiB" if b >= 1024 else f"{b} B"
    return f"{e['name']} {size}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from-ms", type=float, default=0)
    ap.add_argument("--ms", type=float, default=40)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    if not shutil.which("gnuplot"):
        sys.exit("trace_picture.py: gnuplot is not installed (Debian: apt-get install gnuplot-nox)")
    events = json.load(open(a.trace))["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e.get("cat") == "collective"]
    if not slices:
        sys.exit(f"trace_picture.py: no collectives in {a.trace}")
    t0 = min(e["ts"] for e in slices) + a.from_ms * 1000
    t1 = t0 + a.ms * 1000
    tracks = sorted({(e["pid"], e["tid"]) for e in slices})
    row = {t: len(tracks) - i for i, t in enumerate(tracks)}
    kinds = sorted({label(e) for e in slices})
    colour = {k: COLOURS[i % len(COLOURS)] for i, k in enumerate(kinds)}
    ms = lambda ts: (ts - t0) / 1000  # noqa: E731
    g = ["set terminal pngcairo noenhanced size 900,340 font ',10'", f"set output '{a.out}'",
         f"set xrange [0:{a.ms}]", f"set yrange [0.4:{len(tracks) + 0.6}]", "set xlabel 'ms'",
         "set ytics (" + ", ".join(f"'node {p}, rank {t}' {row[(p, t)]}" for p, t in tracks) + ")",
"set key below horizontal", 'set title "' + a.title.replace('"', "'") + '"', "set grid xtics lc rgb '#dddddd'", "unset border", "set border 1"]
    n = 0
    for e in slices:
        s, f = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if f <= s:
            continue
        n += 1
        y = row[(e["pid"], e["tid"])]
        g.append(f"set object {n} rect from {ms(s):.4f},{y - 0.3} to {ms(f):.4f},{y + 0.3} "
                 f"fc rgb '{colour[label(e)]}' fs solid 0.85 noborder")
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for e in events:
        if e["ph"] != "f" or e["id"] not in starts or not t0 <= e["ts"] <= t1:
            continue
        s = starts[e["id"]]
        g.append(f"set arrow from {ms(s['ts']):.4f},{row[(s['pid'], s['tid'])]} to {ms(e['ts']):.4f},"
                 f"{row[(e['pid'], e['tid'])]} lc rgb '#333333' lw 1 head size 0.4,20")
    # The key: one invisible line per kind of call.
    plots = [f"NaN with boxes fs solid lc rgb '{colour[k]}' title '{k}'" for k in kinds]
    plots.append("NaN with vectors lc rgb '#333333' title 'waited for (arrow from the last to enter)'")
    g.append("plot " + ", ".join(plots))
    subprocess.run(["gnuplot"], input="\n".join(g), text=True, check=True)


if __name__ == "__main__":
    main()
