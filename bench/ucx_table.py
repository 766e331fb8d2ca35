#!/usr/bin/env python3
"""The table of bench/ucx_two_hosts.sh: DATA/WAY-PPN-ROUND.json (idist-bench's or raw_mpi's
--json) to one Markdown table per ranks-per-host, the best median call per size and way (as
docs/BENCHMARKS.md reads every figure), with ucx's time over Open MPI's and over gloo's."""
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

WAYS = ["ucx", "gloo", "mpi"]


def size_text(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def us(t):
    return f"{t:,.1f}" if t < 1000 else f"{t:,.0f}"


def line_rate(text):
    """RATE as tc reads it ("1gbit", "100mbit") in bytes per second; None when unset."""
    m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", (text or "").lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def main(data):
    rate = line_rate(os.environ.get("RATE"))
    best = defaultdict(dict)  # (ppn, size) -> way -> (time, busbw)
    wrong = 0
    for path in sorted(Path(data).glob("*.json")):
        way, ppn, _ = path.stem.split("-")
        text = path.read_text()
        if not text.strip():
            print(f"ucx_table: {path.name} is empty (see {path.name}.err)", file=sys.stderr)
            continue
        for r in json.loads(text)["results"]:
            wrong += r.get("wrong", 0)
            key = (int(ppn), r["size"])
            if way not in best[key] or r["time_median_us"] < best[key][way][0]:
                best[key][way] = (r["time_median_us"], r["busbw"])
    for ppn in sorted({p for p, _ in best}):
        print(f"\n#### all_reduce, {ppn} rank{'s' if ppn > 1 else ''} per host ({2 * ppn} ranks)\n")
        share = f" | ucx, gloo, Open MPI: % of the {os.environ.get('RATE')} bound" if rate else ""
        print("| size | ucx us | gloo us | Open MPI us | ucx / Open MPI | ucx / gloo | ucx busbw GB/s | Open MPI busbw GB/s"
              f"{share} |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if rate else ""))
        for size in sorted(s for p, s in best if p == ppn):
            row = best[(ppn, size)]
            if "ucx" not in row:
                continue
            nan = (float("nan"), float("nan"))
            u, g, m = (row.get(w, nan)[0] for w in WAYS)
            for w in WAYS:
                row.setdefault(w, nan)
            # The bound: an all_reduce between two hosts moves at least `size` bytes each way
            # over their link (the other host's half in, ours out, twice), so it takes at
            # least size / rate, whatever the ranks per host; the column is that over the time.
            pct = (" | " + ", ".join(f"{100 * size / rate / (row[w][0] * 1e-6):.0f}" for w in WAYS)) if rate else ""
            print(f"| {size_text(size)} | {us(u)} | {us(g)} | {us(m)} | {u / m:.2f} | {u / g:.2f} | "
                  f"{row['ucx'][1]:.3f} | {row['mpi'][1]:.3f}{pct} |")
    print(f"\nelements wrong: {wrong}")


if __name__ == "__main__":
    main(sys.argv[1])
