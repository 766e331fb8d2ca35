#!/usr/bin/env python3
"""Turns the measurements of scripts/bench.sh into docs/BENCHMARKS.md and its plots.

Reads DATA/bw/IMPL/*.json (idist-bench, raw_gloo and raw_mpi --json documents; IMPL is one of
IMPLS or TWO_HOSTS below: the directory says which, as idist-bench's document says "gloo" over
shared memory, hierarchically and over TCP alike), DATA/launch.jsonl (one wall_time result per line, labelled), DATA/cpu.jsonl
(idist's own CPU time per call), DATA/copy_bw.json (the memcpy ceiling), DATA/bindings-nN.txt
(mpirun --report-bindings) and DATA/meta.json (mode, options, notes), judges the targets, and
writes OUT/BENCHMARKS.md and, when gnuplot is there, OUT/bench-*.png. The part of BENCHMARKS.md below the KEEP marker is
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
# The five ways each collective is measured, as scripts/bench.sh names their directories.
IMPLS = {"shm": "shm", "gloo-tcp": "gloo-TCP", "raw-gloo": "raw Gloo", "raw-mpi": "raw MPI", "idist-mpi": "idist-mpi"}
# 4 ranks on two fake hosts (2 + 2), each way idist-bench ran there. Kept apart from IMPLS: their
# 4 ranks are not the one-host 4 ranks of the tables above, and must not add a 4 to a --quick run.
TWO_HOSTS = {"hier": "hierarchical", "hier-tcp": "gloo-TCP"}
HIER_COLLECTIVES = ["all_reduce", "broadcast", "reduce", "barrier"]
# idist's overhead: each of these against the same calls made directly. shm has no direct
# counterpart; it is judged against MPI by the targets of issue 16 (judge_shm).
OVERHEAD = [("gloo-tcp", "raw-gloo"), ("idist-mpi", "raw-mpi")]
BIG = 64 * 1024          # from here on the target is a busbw ratio, below it a time difference
RATIO_TARGET = 0.95      # idist busbw at least 95% of raw
DELTA_TARGET_US = 5.0    # idist at most 5 us more per call
LINEAR_SLACK = 2.2       # doubling N may at most double launch time (+10% for noise)
MIB = 1024 * 1024
# Issue 16's targets for the shm backend, mpi, and launch.
SHM_LATENCY_FACTOR = {2: 1.0, 4: 2.0}  # 8 B all_reduce: shm time at most this times raw MPI's, per N
MPI_DELTA_8B_US = 1.0                  # idist-mpi at most 1 us over raw MPI at 8 B
SHM_BUSBW_FACTOR = 1.5                 # 64 MiB all_reduce: shm busbw at least 1.5x raw MPI's
SHM_OVER_TCP = 10.0                    # all_reduce, 64 KiB to 64 MiB: shm at least 10x faster than gloo-TCP
LAUNCH_N = 64                          # idist-run -n 64 at most half of mpirun -np 64


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
    """{(impl, n, collective): [result rows]}"""
    runs = {}
    if any((data / "bw").glob("*.json")):
        print("report: bw/*.json is an older bench.sh's layout (before shm, one directory per implementation "
              "since): left out", file=sys.stderr)
    for path in sorted((data / "bw").glob("*/*.json")):
        impl = path.parent.name
        if impl not in IMPLS and impl not in TWO_HOSTS:
            print(f"report: {path}: unknown implementation {impl}; left out", file=sys.stderr)
            continue
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            print(f"report: {path.name}: not JSON ({e}); left out", file=sys.stderr)
            continue
        for r in doc["results"]:
            runs.setdefault((impl, doc["world_size"], r["collective"]), []).append(r)
    return runs


def load_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def bindings(data, n):
    """What Open MPI bound each rank to at N ranks, from its --report-bindings."""
    try:
        text = (data / f"bindings-n{n}.txt").read_text()
    except OSError:
        return None
    maps = [line.rsplit(":", 1)[1].strip() for line in text.splitlines() if "MCW rank" in line and "bound to" in line
            and "not bound" not in line]
    if maps:
        return "bound to core: " + " ".join(f"`{m}`" for m in maps)
    return "not bound"


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


def compare(runs, impl, reference, n, collective):
    """Rows of IMPL vs REFERENCE at equal (size, type, op), with the verdict of each: below BIG
    (and for barrier) the difference of the best median calls, from BIG the ratio of the busbw
    those give."""
    mine = by_size(runs.get((impl, n, collective), []))
    ref = by_size(runs.get((reference, n, collective), []))
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


def fmt_x(factor):
    return f"{factor:,.0f}x" if factor >= 100 else f"{factor:.1f}x"


def launch_table(launch):
    by = {}
    for row in launch:
        by[(row["kind"], row["n"])] = row["result"]
    return by


def judge_launch(by, ns):
    """(target, figure, met) rows, issue 16's N = 64 first; met is None where it was not measured."""
    verdicts = []
    both = [n for n in ns if ("idist-run", n) in by and ("mpirun", n) in by]
    target = f"`idist-run -n {LAUNCH_N}` init + barrier + exit, at most half of `mpirun -np {LAUNCH_N}`"
    if LAUNCH_N in both:
        a, b = by[("idist-run", LAUNCH_N)], by[("mpirun", LAUNCH_N)]
        ratio = a["median_ms"] / b["median_ms"]
        verdicts.append((target, f"{a['median_ms']:.0f} ms vs {b['median_ms']:.0f} ms: {ratio:.2f}x", ratio <= 0.5))
    elif both:
        # A --quick run stops short of 64: the largest N there is shown, but it does not judge 64.
        n = both[-1]
        a, b = by[("idist-run", n)], by[("mpirun", n)]
        verdicts.append((target, f"not measured at {LAUNCH_N}; at {n}: {a['median_ms']:.0f} ms vs "
                                 f"{b['median_ms']:.0f} ms: {a['median_ms'] / b['median_ms']:.2f}x", None))
    else:
        verdicts.append((target, "not measured", None))
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


def point(runs, impl, n, collective, size):
    """The best run's row of IMPL at SIZE (float32 sum), or None."""
    return by_size(runs.get((impl, n, collective), [])).get((size, "float32", "sum"))


def judge_shm(runs, ns_bw):
    """Issue 16's targets for the shm backend and idist-mpi: (target, figure, met) rows; met is
    None where a figure is missing (a --quick run, a failed run)."""
    rows = []

    def missing(n, *parts):
        return f"not measured: no {' or '.join(p for p in parts if p)} run at {n} ranks"

    # Both of the latency targets' N always get a row: a --quick run's missing 4 ranks should
    # show as not judged, not vanish from the list.
    for n, factor in SHM_LATENCY_FACTOR.items():
        shm, mpi = point(runs, "shm", n, "all_reduce", 8), point(runs, "raw-mpi", n, "all_reduce", 8)
        what = (f"all_reduce 8 B, {n} ranks: shm at most raw MPI's time" if factor == 1 else
                f"all_reduce 8 B, {n} ranks: shm within {factor:g}x raw MPI's time")
        if shm and mpi:
            ratio = latency(shm) / latency(mpi)
            rows.append((what, f"{latency(shm):.2f} us vs {latency(mpi):.2f} us: {ratio:.2f}x", ratio <= factor))
        else:
            rows.append((what, missing(n, not shm and "shm", not mpi and "raw MPI"), None))
    for n in ns_bw:
        mine, ref = point(runs, "idist-mpi", n, "all_reduce", 8), point(runs, "raw-mpi", n, "all_reduce", 8)
        what = f"all_reduce 8 B, {n} ranks: idist-mpi within {MPI_DELTA_8B_US:g} us of raw MPI"
        if mine and ref:
            delta = latency(mine) - latency(ref)
            rows.append((what, f"{latency(mine):.2f} us vs {latency(ref):.2f} us: {delta:+.2f} us",
                         delta <= MPI_DELTA_8B_US))
        else:
            rows.append((what, missing(n, not mine and "idist-mpi", not ref and "raw MPI"), None))
    for n in ns_bw:
        shm, mpi = point(runs, "shm", n, "all_reduce", 64 * MIB), point(runs, "raw-mpi", n, "all_reduce", 64 * MIB)
        what = f"all_reduce 64 MiB, {n} ranks: shm busbw at least {SHM_BUSBW_FACTOR:g}x raw MPI's"
        if shm and mpi and median_busbw(mpi) > 0:
            ratio = median_busbw(shm) / median_busbw(mpi)
            rows.append((what, f"{median_busbw(shm):.2f} GB/s vs {median_busbw(mpi):.2f} GB/s: {ratio:.2f}x",
                         ratio >= SHM_BUSBW_FACTOR))
        else:
            rows.append((what, missing(n, not shm and "shm", not mpi and "raw MPI"), None))
    for n in ns_bw:
        shm = by_size(runs.get(("shm", n, "all_reduce"), []))
        tcp = by_size(runs.get(("gloo-tcp", n, "all_reduce"), []))
        sizes = sorted(k for k in set(shm) & set(tcp) if k[1:] == ("float32", "sum") and BIG <= k[0] <= 64 * MIB)
        what = f"all_reduce 64 KiB to 64 MiB, {n} ranks: shm at least {SHM_OVER_TCP:g}x faster than gloo-TCP at every size"
        if sizes:
            speedups = [(k[0], latency(tcp[k]) / latency(shm[k])) for k in sizes if latency(shm[k]) > 0]
            worst = min(speedups, key=lambda s: s[1])
            short = "" if sizes[-1][0] == 64 * MIB else f"; measured up to {human(sizes[-1][0])} only"
            rows.append((what, f"{fmt_x(worst[1])} at worst ({human(worst[0])}); "
                               f"{', '.join(f'{human(z)} {fmt_x(x)}' for z, x in speedups)}{short}",
                         worst[1] >= SHM_OVER_TCP if not short else None))
        else:
            rows.append((what, missing(n, "all_reduce from 64 KiB"), None))
    return rows


def verdict(ok):
    return "not judged" if ok is None else "met" if ok else "**missed**"


def gnuplot(out, runs, ns_bw, by_launch, ns_launch, kinds):
    if not shutil.which("gnuplot"):
        print("report: gnuplot is not installed: no plots (apt-get install gnuplot-nox)", file=sys.stderr)
        return []
    data_dir = out / "bench-plot-data"
    data_dir.mkdir(exist_ok=True)
    lines = [("shm", "idist over shm", "#2ca02c", 1), ("gloo-tcp", "idist over gloo-TCP", "#1f77b4", 1),
             ("raw-gloo", "raw Gloo", "#1f77b4", 2), ("raw-mpi", "raw MPI", "#d62728", 2)]
    made = []
    for n in ns_bw:
        # The key goes where the curves are not: busbw rises with size, time too.
        for what, value, ylabel, key in [("busbw", median_busbw, "bus bandwidth (GB/s)", "bottom right"),
                                         ("time", latency, "time per call, median (us)", "top left")]:
            script = [f"set terminal pngcairo noenhanced size 1350,810 font ',9'",
                      f"set output '{out / f'bench-{what}-n{n}.png'}'",
                      f"set multiplot layout 2,3 title '{ylabel} against size, {n} ranks (solid: idist, dashed: direct calls)'",
                      "set logscale x 2", "set format x '%.0b%B'", "set xlabel 'size (bytes)'",
                      f"set ylabel '{ylabel}'", f"set key {key}", "set grid", "set logscale y 10", "set format y '%g'"]
            for collective in COLLECTIVES[:-1]:
                plots = []
                for impl, title, color, dash in lines:
                    rows = [r for r in by_size(runs.get((impl, n, collective), [])).values()
                            if r["type"] == "float32"]
                    if not rows:
                        continue
                    path = data_dir / f"{what}-n{n}-{collective}-{impl}.dat"
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


def gnuplot_two_hosts(out, runs):
    """Time against size on two hosts, hierarchical and gloo-TCP: bench-two-hosts.png, or None."""
    if not shutil.which("gnuplot"):
        return None
    data_dir = out / "bench-plot-data-two-hosts"
    data_dir.mkdir(exist_ok=True)
    script = ["set terminal pngcairo noenhanced size 1350,420 font ',9'", f"set output '{out / 'bench-two-hosts.png'}'",
              "set multiplot layout 1,3 title 'time per call, median (us), against size: two hosts, 2 + 2 ranks'",
              "set logscale x 2", "set format x '%.0b%B'", "set xlabel 'size (bytes)'",
              "set ylabel 'time per call, median (us)'", "set key top left", "set grid", "set logscale y 10",
              "set format y '%g'"]
    drawn = False
    for collective in HIER_COLLECTIVES[:-1]:
        plots = []
        for impl, title, color in [("hier", "hierarchical", "#2ca02c"), ("hier-tcp", "gloo-TCP", "#1f77b4")]:
            rows = [r for r in by_size(runs.get((impl, 4, collective), [])).values() if r["type"] == "float32"]
            if not rows:
                continue
            path = data_dir / f"{collective}-{impl}.dat"
            path.write_text("".join(f"{r['size']} {latency(r)}\n" for r in sorted(rows, key=lambda r: r["size"])))
            plots.append(f"'{path}' using 1:2 with linespoints lw 2 lc rgb '{color}' title '{title}'")
        drawn = drawn or bool(plots)
        script.append(f"set title '{collective}'")
        script.append("plot " + ", ".join(plots) if plots else "plot 0 notitle")
    script.append("unset multiplot")
    if drawn:
        subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    shutil.rmtree(data_dir)
    return "bench-two-hosts.png" if drawn else None


def times(n):
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def two_hosts_section(runs, meta, plot):
    """The markdown of the two-host measurement: hierarchical against gloo over TCP, 4 ranks."""
    md = ["## Two hosts, 2 + 2 ranks: hierarchical against gloo over TCP", ""]
    if not any(key[0] in TWO_HOSTS for key in runs):
        return md + ["Not measured in this run" + (" (see the notes under Launch cost)." if meta.get("notes") else "."),
                     ""]
    wrong = sum(r["wrong"] for key, rows in runs.items() if key[0] in TWO_HOSTS for r in rows)
    md += ["4 ranks on two fake hosts, as `tests/e2e/hierarchical_netns.sh` makes them: two network namespaces "
           "joined by a veth pair, each rank under its host's name (`unshare --uts`), `idist-run --nnodes 2 "
           "--node-rank K -n 2 idist-bench` on each. **hierarchical** is what idist chooses there by default: "
           "shared memory among a host's two ranks, gloo between the two hosts' leaders; **gloo-TCP** is the same "
           "4 ranks with `IDIST_INTRANODE=off`, gloo over TCP among all four. The collectives are the ones the "
           "hierarchical backend splits (the others it leaves to gloo over every rank). A veth pair is no "
           "network: its bytes are copied by the same 2 cores that run the 4 ranks, so the speed-up is what the "
           "split saves in work on this machine; over a real link, where crossing hosts costs more, only the "
           "leaders' traffic crosses. float32, sum, root 0; small sizes "
           f"`{meta.get('hier_small_options', '?')}` {times(meta.get('hier_repeat'))}, large sizes "
           f"`{meta.get('hier_large_options', '?')}` {times(meta.get('hier_repeat_large'))}, the two back to "
           "back, the order reversed every other round. Times are the best median call (see Targets), busbw as "
           "above for 4 ranks; speed-up is gloo-TCP's time over hierarchical's. Every result was checked element "
           f"by element ({'no element wrong' if wrong == 0 else f'**{wrong} elements wrong**'}).", ""]
    if plot:
        md += [f"![time against size, two hosts]({plot})", ""]
    for collective in HIER_COLLECTIVES:
        best = {impl: {k[0]: r for k, r in by_size(runs.get((impl, 4, collective), [])).items()
                       if k[1] in ("float32", "-")}
                for impl in TWO_HOSTS}
        sizes = sorted(set(best["hier"]) | set(best["hier-tcp"]))
        if not sizes:
            continue
        md += [f"### {collective}, 2 + 2 ranks", "",
               "| size | hierarchical us | gloo-TCP us | speed-up | hierarchical busbw GB/s |",
               "|---:|---:|---:|---:|---:|"]
        for size in sizes:
            hier, tcp = best["hier"].get(size), best["hier-tcp"].get(size)
            md.append("| " + " | ".join([
                human(size) if collective != "barrier" else "–",
                fmt_us(latency(hier)) if hier else "–",
                fmt_us(latency(tcp)) if tcp else "–",
                fmt_x(latency(tcp) / latency(hier)) if hier and tcp and latency(hier) > 0 else "–",
                f"{median_busbw(hier):.3f}" if hier and collective != "barrier" else "–"]) + " |")
        md.append("")
    return md


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    meta = json.loads((args.data / "meta.json").read_text())
    runs = load_bandwidth(args.data)
    launch = load_launch(args.data)
    by_launch = launch_table(launch)
    ns_bw = sorted({key[1] for key in runs if key[0] in IMPLS})
    ns_launch = meta["launch_ns"]
    box = machine()
    cores = meta.get("cores", box["cores"])
    mpirun = meta.get("mpirun", "mpirun")
    args.out.mkdir(parents=True, exist_ok=True)

    kinds = [("idist-run", "idist-run -n N"), ("mpirun", "mpirun -np N"), ("torchrun", "torchrun --nproc_per_node N")]
    plots = gnuplot(args.out, runs, ns_bw, by_launch, ns_launch, kinds)
    two_hosts_plot = gnuplot_two_hosts(args.out, runs)
    if two_hosts_plot:
        plots.append(two_hosts_plot)

    md = ["# Benchmarks", ""]
    md.append(f"Written by `scripts/bench.sh{' --quick' if meta['mode'] == 'quick' else ''}` on {meta['date']} "
              f"in {meta['elapsed_s'] / 60:.1f} minutes; do not edit above the line near the end (the next run "
              "rewrites it).")
    copy = load_json(args.data / "copy_bw.json")
    copy_cell = "not measured"
    if copy:
        rates = ", ".join(f"{t['threads']} thread{'s' if t['threads'] > 1 else ''}: {t['gb_s']:.1f} GB/s"
                          for t in copy["threads"])
        copy_cell = (f"{rates} (`bench/copy_bw`: each thread memcpy's its own {human(copy['bytes'])} buffer; bytes "
                     "copied per second, the memory traffic is twice that): the ceiling for shm's busbw")
    binding = "; ".join(f"{n} ranks: {b}" for n in ns_bw if (b := bindings(args.data, n)))
    md += ["", "## The machine", "",
           "| | |", "|---|---|",
           f"| CPU | {box['cpu']}, {box['cores']} cores (hypervisor: {box['hypervisor']}) |",
           f"| memory | {box['memory_gib']} GiB |",
           f"| memcpy bandwidth | {copy_cell} |",
           f"| system | {box['os']}, kernel {box['kernel']} |",
           f"| software | {box['compiler']}; Gloo {box['gloo']}; Open MPI {box['openmpi']} |",
           f"| mpirun | `{mpirun} -np N`, plus `--oversubscribe` where N > {cores} (it refuses to start "
           f"without); binding left to Open MPI{': ' + binding if binding else ''} |",
           f"| idist | commit {box['commit']}, build type {meta['build_type']} |",
           f"| load when it started | {meta['load']} |", ""]
    if meta.get("mode") == "quick":
        md += ["**This is a `--quick` run**: a short sweep for checking the script, not figures to quote.", ""]

    # --- targets ---
    md += ["## Targets", "",
           "### Issue 16: shared memory, the mpi backend, launch", "",
           "Times are each rank's median call, averaged over ranks, the best of the alternating runs (see below); "
           "busbw is computed from that time. float32 sum. raw MPI is `bench/raw_mpi` under mpirun as in the "
           "machine table; shm is `IDIST_INTRANODE=shm idist-run -n N idist-bench`, gloo-TCP the same with "
           "`IDIST_INTRANODE=off`.", "",
           "| target | measured | |", "|---|---|---|"]
    launch_verdicts = judge_launch(by_launch, ns_launch)
    issue16 = judge_shm(runs, ns_bw) + launch_verdicts[:1]
    for what, figure, ok in issue16:
        md.append(f"| {what} | {figure} | {verdict(ok)} |")
    md.append("")

    verdict_rows = []
    all_wrong = sum(r["wrong"] for key, rows in runs.items() if key[0] in IMPLS for r in rows)
    for impl, reference in OVERHEAD:
        for n in ns_bw:
            for collective in COLLECTIVES:
                rows = compare(runs, impl, reference, n, collective)
                if not rows:
                    continue
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
                verdict_rows.append(f"| {IMPLS[impl]} against {IMPLS[reference]} | {n} | {collective} | "
                                    f"{'; '.join(parts)} | "
                                    f"{'met' if ok else f'**missed** at {missed} of {len(rows)} sizes'} |")

    md += ["### idist's overhead over the calls it makes", "",
           f"idist against the same calls made directly: gloo-TCP against `bench/raw_gloo`, idist-mpi against "
           f"`bench/raw_mpi`, per collective: from {human(BIG)} on, idist's bus bandwidth at least {RATIO_TARGET:.0%} "
           f"of the direct calls'; below, at most {DELTA_TARGET_US:g} us more per call. Times are each rank's median "
           f"call, averaged over ranks, the best of {meta['repeat']} alternating runs of each below {human(BIG)} and "
           f"of {meta['repeat_large']} from there on (a mean, as nccl-tests reports it, is moved by the odd call a "
           "busy 2-core machine holds up by milliseconds; the means are in the runs' own documents, which "
           "`scripts/bench.sh --keep DIR` keeps). Float32 sums; every result of all five was checked element by "
           f"element ({'no element wrong' if all_wrong == 0 else f'**{all_wrong} elements wrong**'}). On a 2-core "
           "machine the wall clock of small calls swings by tens of microseconds from run to run (gloo's I/O thread "
           "has to be woken for every message), so the CPU time per call below is the steadier measure of what idist "
           "adds.", "",
           "| idist | ranks | collective | worst case | target |", "|---|---|---|---|---|"]
    md += verdict_rows
    cpu = []
    if (args.data / "cpu.jsonl").exists():
        cpu = [json.loads(line) for line in (args.data / "cpu.jsonl").read_text().splitlines() if line.strip()]
    if cpu:
        md += ["", f"What idist's own code costs, which that noise hides: CPU time per call and rank spent in libidist "
                   f"(perf samples at 10 kHz, {meta['cpu_calls']} calls, gloo over TCP (`IDIST_INTRANODE=off`: over "
                   "shm the backend itself is libidist, and its samples would be the whole collective), 2 ranks, "
                   "8 B; send_recv: per round trip), against all the CPU time the rank spent (Gloo, the kernel, the "
                   "benchmark, its start-up included), per call.", "",
               "| collective | in libidist, us | all, us | share |", "|---|---:|---:|---:|"]
        for row in cpu:
            share = row["idist_us"] / row["all_us"] if row["all_us"] > 0 else 0
            md.append(f"| {row['collective']} | {row['idist_us']:.2f} | {row['all_us']:.1f} | {share:.1%} |")
    md += ["", "### Launch", "", "| launch target | measured (median of runs) | |", "|---|---|---|"]
    for what, figure, ok in launch_verdicts[1:]:
        md.append(f"| {what} | {figure} | {verdict(ok)} |")
    md.append("")

    # --- launch ---
    md += ["## Launch cost", "",
           "Wall time of a program that initialises, runs one barrier and exits, started by each launcher with N "
           f"ranks on this machine (oversubscribed beyond {cores}; idist-run with its defaults, so shared memory "
           f"from 2 ranks; mpirun as in the machine table); median and minimum of "
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
    md += ["## Collectives: shm, gloo-TCP, raw Gloo, raw MPI, idist-mpi", "",
           f"Each collective on {' and '.join(map(str, ns_bw))} ranks, five ways: **shm** "
           "(`IDIST_INTRANODE=shm idist-run -n N idist-bench`, what one host gets by default), **gloo-TCP** "
           "(`IDIST_INTRANODE=off`, the same over loopback TCP), **raw Gloo** (`idist-run -n N bench/raw_gloo`), "
           "**raw MPI** (`bench/raw_mpi`) and **idist-mpi** (`idist-bench --backend mpi`), the last two under "
           "mpirun as in the machine table. float32, sum, root 0; small sizes "
           f"`{meta['small_options']}` (shm, raw MPI and idist-mpi: "
           f"`{meta.get('small_spin_options', meta['small_options'])}`) {meta['repeat']} times, "
           f"large sizes `{meta['large_options']}` "
           f"{meta['repeat_large']} times, back to back in rows of gloo-TCP, raw Gloo and of shm, raw MPI, "
           "idist-mpi (raw MPI in the middle, beside both), the order reversed every other round. Times are the best "
           "median call (see Targets). busbw = algbw × 2(n−1)/n for all_reduce, (n−1)/n for all_gather and "
           "reduce_scatter, 1 for broadcast, reduce and send_recv (a ping-pong between pairs of ranks; time is half "
           "the round trip), as nccl-tests. shm / raw MPI is the time ratio (below 1: shm is faster); speed-up is "
           "gloo-TCP's time over shm's. ✗ marks a gloo-TCP or idist-mpi figure that misses its overhead target "
           "against raw Gloo or raw MPI.", ""]
    for n in ns_bw:
        for what in ["busbw", "time"]:
            if f"bench-{what}-n{n}.png" in plots:
                md.append(f"![{what} against size, {n} ranks](bench-{what}-n{n}.png)")
        md.append("")
        for collective in COLLECTIVES:
            best = {impl: {k[0]: r for k, r in by_size(runs.get((impl, n, collective), [])).items()
                           if k[1] in ("float32", "-")}
                    for impl in IMPLS}
            marks = {impl: {r["size"]: r["ok"] for r in compare(runs, impl, ref, n, collective)}
                     for impl, ref in OVERHEAD}
            sizes = sorted(set().union(*[set(t) for t in best.values()]))
            if not sizes:
                continue
            md += [f"### {collective}, {n} ranks", "",
                   "| size | shm us | gloo-TCP us | raw Gloo us | raw MPI us | idist-mpi us | shm busbw GB/s | "
                   "raw MPI busbw GB/s | shm / raw MPI | shm speed-up over gloo-TCP |",
                   "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for size in sizes:
                cells = [human(size) if collective != "barrier" else "–"]
                for impl in IMPLS:
                    r = best[impl].get(size)
                    mark = " ✗" if impl in marks and marks[impl].get(size) is False else ""
                    cells.append(fmt_us(latency(r)) + mark if r else "–")
                shm, mpi, tcp = best["shm"].get(size), best["raw-mpi"].get(size), best["gloo-tcp"].get(size)
                for r in (shm, mpi):
                    cells.append(f"{median_busbw(r):.3f}" if r and collective != "barrier" else "–")
                cells.append(f"{latency(shm) / latency(mpi):.2f}" if shm and mpi and latency(mpi) > 0 else "–")
                cells.append(fmt_x(latency(tcp) / latency(shm)) if shm and tcp and latency(shm) > 0 else "–")
                md.append("| " + " | ".join(cells) + " |")
            md.append("")

    md += two_hosts_section(runs, meta, two_hosts_plot)

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
