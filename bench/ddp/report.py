#!/usr/bin/env python3
"""The table of bench/ddp/run.sh: per network and per-rank batch, the median over rounds of
each run's median step, and the derived figures the training issue judges:
  step ratio       auto_model's step / torch DDP's step              (target <= 0.8)
  exposed          2-rank step - the same implementation's single step
  exposed ratio    idist's exposed / torch's exposed                  (target <= 0.5)
  efficiency       single step / 2-rank step (1.0: perfect scaling of throughput from 1 to 2 ranks)

    python3 bench/ddp/report.py DDP.jsonl [--plot PNG]
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("jsonl")
    parser.add_argument("--plot")
    args = parser.parse_args()
    runs = defaultdict(list)
    phases = defaultdict(lambda: defaultdict(list))
    for line in Path(args.jsonl).read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            key = (r["model"], r["batch_per_rank"], r["impl"], r["mode"])
            runs[key].append(r["step_ms_median"])
            for name, ms in r.get("phase_ms_median", {}).items():
                phases[key][name].append(ms)
    med = {k: statistics.median(v) for k, v in runs.items()}
    configs = sorted({(m, b) for m, b, _, _ in runs}, key=lambda c: (c[0], c[1]))
    print("| network, batch per rank | idist single | idist auto_model | idist after backward | torch single | "
          "torch DDP | step ratio (target <= 0.8) | exposed idist / torch (target <= 0.5) | efficiency idist / torch | rounds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for model, batch in configs:
        get = lambda impl, mode: med.get((model, batch, impl, mode))
        i1, i2, ia = get("idist", "single"), get("idist", "auto_model"), get("idist", "after_backward")
        t1, t2 = get("torch", "single"), get("torch", "ddp")
        if None in (i1, i2, t1, t2):
            continue
        ei, et = i2 - i1, t2 - t1
        exposed = f"{ei:.0f} / {et:.0f} ms = {ei / et:.2f}" if et > 0 else f"{ei:.0f} / {et:.0f} ms"
        n = len(runs[(model, batch, "idist", "auto_model")])
        print(f"| {model}, {batch} | {i1:.0f} ms | {i2:.0f} ms | {ia:.0f} ms | {t1:.0f} ms | {t2:.0f} ms | "
              f"{i2 / t2:.2f} | {exposed} | {i1 / i2:.2f} / {t1 / t2:.2f} | {n} |")
        rows.append((f"{model} b{batch}", i2, t2, ia, i1))
    # Where each step's time goes: the median over rounds of each run's median phase.
    print()
    print("| network, batch per rank | run | zero_grad | forward | backward | all_reduce after | step | total |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, batch in configs:
        for impl, mode in (("idist", "single"), ("idist", "auto_model"), ("idist", "after_backward"),
                           ("torch", "single"), ("torch", "ddp")):
            p = phases.get((model, batch, impl, mode))
            if not p:
                continue
            cell = lambda name: f"{statistics.median(p[name]):.0f}" if name in p else "-"
            print(f"| {model}, {batch} | {impl} {mode} | {cell('zero_grad')} | {cell('forward')} | {cell('backward')} | "
                  f"{cell('all_reduce_after')} | {cell('step')} | {med[(model, batch, impl, mode)]:.0f} |")
    if args.plot and shutil.which("gnuplot") and rows:
        data = Path(args.plot).with_suffix(".dat")
        data.write_text("\n".join(f'"{name}" {a:.1f} {b:.1f} {c:.1f} {d:.1f}' for name, a, b, c, d in rows) + "\n")
        script = f"""
set terminal pngcairo size 800,380 font ',10'
set output '{args.plot}'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel 'step time, ms (2 ranks, lower is better)'
set key left top
set yrange [0:*]
plot '{data}' using 2:xtic(1) title 'idist auto\\_model', '' using 3 title 'torch DDP (gloo)', \\
     '' using 4 title 'idist, all\\_reduce after backward', '' using 5 title 'one process, no communication'
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
        data.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
