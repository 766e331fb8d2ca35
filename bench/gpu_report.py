#!/usr/bin/env python3
"""Turns a GPU run's folder (tests/gpu/run_on_gpu.sh OUT) into the nccl section of
docs/BENCHMARKS.md: a table of idist-bench --backend nccl beside PyTorch's ProcessGroupNCCL on
the same sizes, and, where gnuplot is there, a plot of the bandwidth against the GPU's peak
memory bandwidth.

    python3 bench/gpu_report.py --run DIR [--plot docs/bench-nccl.png] > section.md

In a world of one, NCCL moves no byte between GPUs: an in-place all_reduce, reduce or
broadcast is a launch and nothing more, an out-of-place all_gather or reduce_scatter one copy
on the device. The figures are the per-call cost of each stack, and for the copies how close
they come to the memory's bandwidth: a copy of B bytes reads and writes B, so its algbw can
reach at most half the peak.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The makers' figures for HBM bandwidth, GB/s.
PEAK_GBPS = {"H200": 4800.0, "H100 80GB HBM3": 3350.0, "H100 PCIe": 2000.0, "H100 NVL": 3900.0}
ORDER = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]


def peak_for(device):
    for key, value in PEAK_GBPS.items():
        if key in device:
            return key, value
    return None, None


def read_idist(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) != 13 or not fields[1].isdigit():
            continue
        rows.append({"collective": fields[0], "bytes": int(fields[1]), "time_us": float(fields[6]),
                     "algbw": float(fields[9]), "wrong": fields[11], "iters": int(fields[12])})
    return rows


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}iB"
    return f"{n} B"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="the folder run_on_gpu.sh wrote")
    parser.add_argument("--plot", help="write the plot here (needs gnuplot)")
    args = parser.parse_args()
    run = Path(args.run)
    idist = read_idist(run / "bench_idist.txt")
    torch = json.loads((run / "bench_torch.json").read_text()) if (run / "bench_torch.json").exists() else None
    ref = {(r["collective"], r["bytes"]): r for r in (torch["results"] if torch else [])}
    device = torch["device"] if torch else "the GPU"
    peak_name, peak = peak_for(device)

    out = []
    if torch:
        out.append(f"PyTorch {torch['torch']} with NCCL {torch['nccl']} on one {device}, a world of one; "
                   f"a device-to-device copy of {human(torch['copy']['bytes'])} moved "
                   f"{torch['copy']['read_plus_write_GBps']:.0f} GB/s counting bytes read and written"
                   + (f" (the {peak_name}'s peak: {peak:.0f} GB/s)." if peak else "."))
        out.append("")
    out.append("| collective | size | idist (us) | torch (us) | idist / torch | idist algbw (GB/s) | torch algbw (GB/s) | #wrong |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    shown = {8, 1024, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30}
    for name in ORDER:
        for r in idist:
            if r["collective"] != name or (name != "barrier" and r["bytes"] not in shown):
                continue
            t = ref.get((name, r["bytes"]))
            ratio = f"{r['time_us'] / t['time_us']:.2f}" if t and t["time_us"] > 0 else "-"
            out.append(f"| {name} | {human(r['bytes']) if name != 'barrier' else '-'} | {r['time_us']:.1f} | "
                       f"{t['time_us']:.1f} | {ratio} | {r['algbw']:.1f} | {t['algbw_GBps']:.1f} | {r['wrong']} |"
                       if t else
                       f"| {name} | {human(r['bytes'])} | {r['time_us']:.1f} | - | - | {r['algbw']:.1f} | - | {r['wrong']} |")
    print("\n".join(out))

    if args.plot and shutil.which("gnuplot"):
        data = Path(args.plot).with_suffix(".dat")
        lines = []
        for name in ("all_gather", "all_reduce"):
            for series, rows in (("idist", [r for r in idist if r["collective"] == name]),
                                 ("torch", [{"bytes": r["bytes"], "algbw": r["algbw_GBps"], "time_us": r["time_us"]}
                                            for r in (torch["results"] if torch else []) if r["collective"] == name])):
                lines.append(f"# {name} {series}")
                lines += [f"{r['bytes']} {r['algbw']} {r['time_us']}" for r in rows]
                lines += ["", ""]
        data.write_text("\n".join(lines))
        ceiling = f"{peak / 2}" if peak else "1/0"
        copy = f"{torch['copy']['read_plus_write_GBps'] / 2}" if torch else "1/0"
        script = f"""
set terminal pngcairo size 1000,420 font ',10'
set output '{args.plot}'
set multiplot layout 1,2
set logscale x 2
set xtics ('8 B' 8, '1 KiB' 1024, '32 KiB' 32768, '1 MiB' 1048576, '32 MiB' 33554432, '1 GiB' 1073741824)
set key left top Left reverse
set title 'all\\_gather (a copy on the GPU in a world of one): algbw'
set ylabel 'GB/s'
set xlabel 'size'
plot '{data}' index 0 using 1:2 with linespoints title 'idist nccl', \\
     '{data}' index 1 using 1:2 with linespoints title 'torch ProcessGroupNCCL', \\
     {ceiling} with lines dashtype 2 title 'peak memory bandwidth / 2 ({peak_name or "?"})', \\
     {copy} with lines dashtype 3 title 'measured device copy / 2'
set logscale y 10
set title 'all\\_reduce in place: time per call'
set ylabel 'us'
plot '{data}' index 2 using 1:3 with linespoints title 'idist nccl', \\
     '{data}' index 3 using 1:3 with linespoints title 'torch ProcessGroupNCCL'
unset multiplot
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        data.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
