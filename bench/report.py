#!/usr/bin/env python3
"""Turns the measurements of scripts/bench.sh into docs/BENCHMARKS.md and its plots.

Reads DATA/bw/*.json (idist-bench, raw_gloo and raw_mpi --json documents), DATA/launch.jsonl
(one wall_time result per line, labelled), DATA/cpu.jsonl (idist's own CPU time per call) and
DATA/meta.json (mode, options, notes), judges the targets, and writes OUT/BENCHMARKS.md and,
when gnuplot is there, OUT/bench-*.png. The part of BENCHMARKS.md below the KEEP marker is
written by people ("What we found") and kept across runs.

    python3 bench/report.py --data DIR --out docs     # DIR as kept by scripts/bench.sh --keep DIR
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

KEEP = "<!-- Everything below this line is written by hand and kept by scripts/bench.sh across runs. -->"
COLLECTIVES = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce", "send_recv", "barrier"]
BACKENDS = ["gloo", "mpi"]
BIG = 64 * 1024          # from here on the target is a busbw ratio, below it a time difference
RATIO_TARGET = 0.95      # idist busbw at least 95% of raw
DELTA_TARGET_US = 5.0    # idist at most 5 us more per call
LINEAR_SLACK = 2.2       # doubling N may at most double launch time (+10% for noise)


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def machine():
    lscpu = {}
    for line in run(["lscpu"]).splitlines():
        key, _, value = line.partition(":")
        lscpu[key.strip()] = value.strip()
    commit = run(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    if run(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (with uncommitted changes)"
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass

    def version(package):
        return run(["dpkg-query", "-W", "-f=${Version}", package]) or "?"

    return {
        "cpu": lscpu.get("Model name", platform.processor() or "?"),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]) or platform.platform(),
        "hypervisor": lscpu.get("Hypervisor vendor", "none"),
        "commit": commit,
        "gloo": version("libgloo-dev"),
        "openmpi": version("openmpi-bin"),
        "compiler": run(["sh", "-c", "c++ --version | head -1"]),
    }


def load_bandwidth(data):
    """{(backend, impl, n, collective): [result rows]}"""
    runs = {}
    for path in sorted((data / "bw").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            print(f"report: {path.name}: not JSON ({e}); left out", file=sys.stderr)
            continue
        for r in doc["results"]:
            key = (doc["backend"], doc["implementation"], doc["world_size"], r["collective"])
            runs.setdefault(key, []).append(r)
    return runs


def load_launch(data):
    rows = []
    path = data / "launch.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def latency(row):
    """What a small size is judged by: the median call (the mean where an old run lacks it)."""
    return row.get("time_median_us", row["time_us"])


def by_size(rows):
    """One row per (size, type, op): of repeated runs, the one with the best median call."""
    best = {}
    for r in rows:
        key = (r["size"], r["type"], r["redop"])
        if key not in best or latency(r) < latency(best[key]):
            best[key] = r
    return best


def median_busbw(row):
    """busbw from the median call rather than the mean (busbw goes as 1 / time)."""
    return row["busbw"] * row["time_us"] / latency(row) if latency(row) > 0 else 0


def compare(runs, backend, n, collective):
    """Rows of idist vs raw at equal (size, type, op), with the verdict of each: below BIG (and
    for barrier) the difference of the best median calls, from BIG the ratio of the busbw those
    give."""
    mine = by_size(runs.get((backend, "idist", n, collective), []))
    ref = by_size(runs.get((backend, "raw", n, collective), []))
    out = []
    for key in sorted(set(mine) & set(ref)):
        a, b = mine[key], ref[key]
        small = collective == "barrier" or key[0] < BIG
        delta = latency(a) - latency(b)
        ratio = median_busbw(a) / median_busbw(b) if median_busbw(b) > 0 else None
        ok = delta <= DELTA_TARGET_US if small else ratio is not None and ratio >= RATIO_TARGET
        out.append({"size": key[0], "type": key[1], "redop": key[2], "idist": a, "raw": b, "idist_us": latency(a),
                    "raw_us": latency(b), "delta_us": delta, "ratio": ratio, "ok": ok, "small": small,
                    "wrong": a["wrong"] + b["wrong"]})
    return out


def human(size):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if size < 1024 or size % 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} TiB"


def fmt_us(us):
    return f"{us:.1f}" if us < 1000 else f"{us:,.0f}"


def launch_table(launch):
    by = {}
    for row in launch:
        by[(row["kind"], row["n"])] = row["result"]
    return by


def judge_launch(by, ns):
    verdicts = []
    idist4, mpi4 = by.get(("idist-run", 4)), by.get(("mpirun", 4))
    if idist4 and mpi4:
        ratio = idist4["median_ms"] / mpi4["median_ms"]
        verdicts.append(("`idist-run -n 4` init + barrier + exit, at most half of `mpirun -np 4`",
                         f"{idist4['median_ms']:.0f} ms vs {mpi4['median_ms']:.0f} ms: {ratio:.2f}x", ratio <= 0.5))
    steps = []
    many = [n for n in ns if n >= 2]  # a world of one needs no rendezvous: another path, not a point on the line
    for a, b in zip(many, many[1:]):
        ta, tb = by.get(("idist-run", a)), by.get(("idist-run", b))
        if ta and tb:
            steps.append((a, b, tb["median_ms"] / ta["median_ms"] * a * 2 / b))
    if steps:
        worst = max(steps, key=lambda s: s[2])
        text = ", ".join(f"{a}→{b}: {r:.2f}" for a, b, r in steps)
        verdicts.append((f"launch time no worse than linear in N, 2 to {ns[-1]} (time ratio per doubling of N at most 2, +10% for noise)",
                         text, worst[2] <= LINEAR_SLACK))
    true, wrapped = by.get(("true", 1)), by.get(("idist-run-true", 1))
    if true and wrapped:
        delta = wrapped["median_ms"] - true["median_ms"]
        verdicts.append(("`idist-run -n 1 /bin/true` within 5 ms of `/bin/true`",
                         f"{wrapped['median_ms']:.2f} ms vs {true['median_ms']:.2f} ms: +{delta:.2f} ms", delta <= 5))
    return verdicts


def gnuplot(out, runs, ns_bw, by_launch, ns_launch, kinds):
    if not shutil.which("gnuplot"):
        print("report: gnuplot is not installed: no plots (apt-get install gnuplot-nox)", file=sys.stderr)
        return []
    data_dir = out / "bench-plot-data"
    data_dir.mkdir(exist_ok=True)
    lines = [("gloo", "idist", "idist over gloo", "#1f77b4", 1), ("gloo", "raw", "raw Gloo", "#1f77b4", 2),
             ("mpi", "idist", "idist over mpi", "#d62728", 1), ("mpi", "raw", "raw MPI", "#d62728", 2)]
    made = []
    for n in ns_bw:
        for what, value, ylabel in [("busbw", median_busbw, "bus bandwidth (GB/s)"),
                                    ("time", latency, "time per call, median (us)")]:
            script = [f"set terminal pngcairo noenhanced size 1350,810 font ',9'",
                      f"set output '{out / f'bench-{what}-n{n}.png'}'",
                      f"set multiplot layout 2,3 title '{ylabel} against size, {n} ranks (solid: idist, dashed: direct calls)'",
                      "set logscale x 2", "set format x '%.0b%B'", "set xlabel 'size (bytes)'",
                      f"set ylabel '{ylabel}'", "set key top left", "set grid", "set logscale y 10", "set format y '%g'"]
            for collective in COLLECTIVES[:-1]:
                plots = []
                for backend, impl, title, color, dash in lines:
                    rows = [r for r in by_size(runs.get((backend, impl, n, collective), [])).values()
                            if r["type"] == "float32"]
                    if not rows:
                        continue
                    path = data_dir / f"{what}-n{n}-{collective}-{backend}-{impl}.dat"
                    path.write_text("".join(f"{r['size']} {value(r)}\n" for r in sorted(rows, key=lambda r: r["size"])))
                    plots.append(f"'{path}' using 1:2 with linespoints lw 2 dt {dash} lc rgb '{color}' title '{title}'")
                script.append(f"set title '{collective}'")
                script.append("plot " + ", ".join(plots) if plots else "plot 0 notitle")
            script.append("unset multiplot")
            subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
            made.append(f"bench-{what}-n{n}.png")
    script = [f"set terminal pngcairo noenhanced size 900,600 font ',10'", f"set output '{out / 'bench-launch.png'}'",
              "set title 'Launch: init + one barrier + exit, N ranks on this machine (log-log: slope 1 is linear growth)'",
              "set logscale x 2", "set logscale y 10", "set format y '%g'",
              "set xlabel 'ranks (N)'", "set ylabel 'wall time, median (ms)'", "set key top left", "set grid"]
    plots = []
    for kind, title in kinds:
        rows = sorted((n, by_launch[(kind, n)]) for n in ns_launch if (kind, n) in by_launch)
        if not rows:
            continue
        path = data_dir / f"launch-{kind}.dat"
        path.write_text("".join(f"{n} {r['median_ms']} {r['min_ms']}\n" for n, r in rows))
        plots.append(f"'{path}' using 1:2 with linespoints lw 2 title '{title}'")
    if plots:
        script.append("plot " + ", ".join(plots))
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
        made.append("bench-launch.png")
    shutil.rmtree(data_dir)
    return made


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    meta = json.loads((args.data / "meta.json").read_text())
    runs = load_bandwidth(args.data)
    launch = load_launch(args.data)
    by_launch = launch_table(launch)
    ns_bw = sorted({key[2] for key in runs})
    ns_launch = meta["launch_ns"]
    box = machine()
    args.out.mkdir(parents=True, exist_ok=True)

    kinds = [("idist-run", "idist-run -n N"), ("mpirun", "mpirun -np N"), ("torchrun", "torchrun --nproc_per_node N")]
    plots = gnuplot(args.out, runs, ns_bw, by_launch, ns_launch, kinds)

    md = ["# Benchmarks", ""]
    md.append(f"Written by `scripts/bench.sh{' --quick' if meta['mode'] == 'quick' else ''}` on {meta['date']} "
              f"in {meta['elapsed_s'] / 60:.1f} minutes; do not edit above the line near the end (the next run "
              "rewrites it).")
    md += ["", "## The machine", "",
           "| | |", "|---|---|",
           f"| CPU | {box['cpu']}, {box['cores']} cores (hypervisor: {box['hypervisor']}) |",
           f"| memory | {box['memory_gib']} GiB |",
           f"| system | {box['os']}, kernel {box['kernel']} |",
           f"| software | {box['compiler']}; Gloo {box['gloo']}; Open MPI {box['openmpi']} |",
           f"| idist | commit {box['commit']}, build type {meta['build_type']} |",
           f"| load when it started | {meta['load']} |", ""]
    if meta.get("mode") == "quick":
        md += ["**This is a `--quick` run**: a short sweep for checking the script, not figures to quote.", ""]

    # --- targets ---
    verdict_rows = []
    all_wrong = 0
    for backend in BACKENDS:
        for n in ns_bw:
            for collective in COLLECTIVES:
                rows = compare(runs, backend, n, collective)
                if not rows:
                    continue
                all_wrong += sum(r["wrong"] for r in rows)
                small = [r for r in rows if r["small"]]
                big = [r for r in rows if not r["small"]]
                parts = []
                if small:
                    worst = max(small, key=lambda r: r["delta_us"])
                    parts.append(f"worst Δ {worst['delta_us']:+.1f} us ({human(worst['size'])})")
                if big:
                    worst = min(big, key=lambda r: r["ratio"] or 0)
                    parts.append(f"worst busbw ratio {worst['ratio'] or 0:.2f} ({human(worst['size'])})")
                ok = all(r["ok"] for r in rows)
                missed = sum(not r["ok"] for r in rows)
                verdict_rows.append(f"| {backend} | {n} | {collective} | {'; '.join(parts)} | "
                                    f"{'met' if ok else f'**missed** at {missed} of {len(rows)} sizes'} |")

    md += ["## Targets", "",
           f"idist against the same calls made directly (`bench/raw_gloo`, `bench/raw_mpi`), per collective: from "
           f"{human(BIG)} on, idist's bus bandwidth at least {RATIO_TARGET:.0%} of the direct calls'; below, at most "
           f"{DELTA_TARGET_US:g} us more per call. Times are each rank's median call, averaged over ranks, the best of "
           f"{meta['repeat']} alternating runs of each below {human(BIG)} and of {meta['repeat_large']} from there on "
           "(a mean, as nccl-tests reports it, is moved by the odd call a busy 2-core machine holds up by milliseconds; "
           "the means are in the runs' own documents, which `scripts/bench.sh --keep DIR` keeps). Float32 sums; every "
           "result of both was checked "
           f"element by element ({'no element wrong' if all_wrong == 0 else f'**{all_wrong} elements wrong**'}). "
           "On a 2-core machine the wall clock of small calls swings by tens of microseconds from run to run (gloo's "
           "I/O thread has to be woken for every message), so the CPU time per call below is the steadier measure "
           "of what idist adds.", "",
           "| backend | ranks | collective | worst case | target |", "|---|---|---|---|---|"]
    md += verdict_rows
    cpu = []
    if (args.data / "cpu.jsonl").exists():
        cpu = [json.loads(line) for line in (args.data / "cpu.jsonl").read_text().splitlines() if line.strip()]
    if cpu:
        md += ["", f"What idist's own code costs, which that noise hides: CPU time per call and rank spent in libidist "
                   f"(perf samples at 10 kHz, {meta['cpu_calls']} calls, gloo, 2 ranks, 8 B; send_recv: per round "
                   "trip), against all the CPU time the rank spent (Gloo, the kernel, the benchmark, its start-up included), per call.", "",
               "| collective | in libidist, us | all, us | share |", "|---|---:|---:|---:|"]
        for row in cpu:
            share = row["idist_us"] / row["all_us"] if row["all_us"] > 0 else 0
            md.append(f"| {row['collective']} | {row['idist_us']:.2f} | {row['all_us']:.1f} | {share:.1%} |")
    md += ["", "| launch target | measured (median of runs) | |", "|---|---|---|"]
    for what, figure, ok in judge_launch(by_launch, ns_launch):
        md.append(f"| {what} | {figure} | {'met' if ok else '**missed**'} |")
    md.append("")

    # --- launch ---
    md += ["## Launch cost", "",
           "Wall time of a program that initialises, runs one barrier and exits, started by each launcher with N "
           f"ranks on this machine (oversubscribed beyond {box['cores']}); median and minimum of "
           f"{meta['launch_reps']} runs after one untimed run, timed by `bench/wall_time` (no shell in between).", ""]
    md.append("| N | " + " | ".join(title for _, title in kinds) + " | idist-run / mpirun |")
    md.append("|---" * (len(kinds) + 2) + "|")
    for n in ns_launch:
        cells = []
        for kind, _ in kinds:
            r = by_launch.get((kind, n))
            cells.append(f"{r['median_ms']:.0f} ms (min {r['min_ms']:.0f})" if r else "–")
        a, b = by_launch.get(("idist-run", n)), by_launch.get(("mpirun", n))
        cells.append(f"{a['median_ms'] / b['median_ms']:.2f}" if a and b else "–")
        md.append(f"| {n} | " + " | ".join(cells) + " |")
    true, wrapped = by_launch.get(("true", 1)), by_launch.get(("idist-run-true", 1))
    if true and wrapped:
        md += ["", f"`/bin/true`: {true['median_ms']:.2f} ms (min {true['min_ms']:.2f}); "
                   f"`idist-run -n 1 /bin/true`: {wrapped['median_ms']:.2f} ms (min {wrapped['min_ms']:.2f}), "
                   f"median of {meta['true_reps']} runs."]
    for note in meta.get("notes", []):
        md += ["", f"Note: {note}"]
    if "bench-launch.png" in plots:
        md += ["", "![launch time against N](bench-launch.png)"]
    md.append("")

    # --- bandwidth ---
    md += ["## Collectives: idist against direct calls", "",
           f"`idist-bench` and the references, one after the other per collective, {' and '.join(map(str, ns_bw))} ranks "
           f"(gloo: `idist-run -n N`; mpi: `mpirun -np N`), float32, sum, root 0; small sizes `{meta['small_options']}` "
           f"{meta['repeat']} times, large sizes `{meta['large_options']}` {meta['repeat_large']} times. Times are "
           "the best median call (see Targets) and busbw is computed from them. "
           "busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather and reduce_scatter, 1 for broadcast, "
           "reduce and send_recv (a ping-pong between pairs of ranks; time is half the round trip). Ratio = idist busbw "
           "/ direct busbw; ✗ marks a size that misses its target.", ""]
    for n in ns_bw:
        for what in ["busbw", "time"]:
            if f"bench-{what}-n{n}.png" in plots:
                md.append(f"![{what} against size, {n} ranks](bench-{what}-n{n}.png)")
        md.append("")
        for collective in COLLECTIVES:
            table = {b: {r["size"]: r for r in compare(runs, b, n, collective)} for b in BACKENDS}
            sizes = sorted(set().union(*[set(t) for t in table.values()]))
            if not sizes:
                continue
            md += [f"### {collective}, {n} ranks", "",
                   "| size | gloo: idist us | raw us | Δ us | busbw GB/s | ratio | mpi: idist us | raw us | Δ us | busbw GB/s | ratio |",
                   "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for size in sizes:
                cells = [human(size) if collective != "barrier" else "–"]
                for backend in BACKENDS:
                    r = table[backend].get(size)
                    if not r:
                        cells += ["–"] * 5
                        continue
                    mark = "" if r["ok"] else " ✗"
                    cells += [fmt_us(r["idist_us"]), fmt_us(r["raw_us"]),
                              f"{r['delta_us']:+.1f}" + (mark if r["small"] else ""),
                              f"{median_busbw(r['idist']):.3f}",
                              (f"{r['ratio']:.2f}" if r["ratio"] is not None else "–") + ("" if r["small"] else mark)]
                md.append("| " + " | ".join(cells) + " |")
            md.append("")

    old = args.out / "BENCHMARKS.md"
    kept = ["## What we found", "", "(Nothing written yet: say here what the figures above mean, what was profiled "
            "and what was fixed.)", ""]
    if old.exists() and KEEP in old.read_text():
        kept = old.read_text().split(KEEP, 1)[1].strip("\n").splitlines() + [""]
    md += [KEEP, ""] + kept
    old.write_text("\n".join(md))

    print(f"report: wrote {old}" + (f" and {', '.join(plots)}" if plots else ""))


if __name__ == "__main__":
    main()
