#!/usr/bin/env python3
"""Checks a trace written by `idist-run --trace` against the Trace Event format that
ui.perfetto.dev and chrome://tracing read, and against what idist promises of it.

    trace_check.py FILE --ranks 0,1,2,3 --nodes 0,1 [--calls N] [--slow RANK] [--partial]

The format: a JSON object whose traceEvents is a list; every event has a known phase; complete
events ("X") have a name, a numeric ts and a dur >= 0, integer pid and tid; metadata ("M") names
processes and threads; flow starts ("s") and ends ("f") pair up by id. Then idist's promises:
one track (tid) per rank with its name, nodes as processes, timestamps monotonic on each track
and slices that nest (Perfetto draws no others), no call lost (otherData.lost_calls 0), every
collective's ranks agreeing on it (--partial: a job cut short, whose last calls some ranks never
entered), and with --slow, the rank most waited for. Prints one line per failed check; exits non-zero if any failed.
"""
import argparse
import json
import sys
from collections import Counter, defaultdict

PHASES = {"X", "M", "s", "f", "i"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--ranks", required=True)
    ap.add_argument("--nodes", default="0")
    ap.add_argument("--calls", type=int, help="collective calls each rank made")
    ap.add_argument("--slow", type=int, help="the rank the others waited for most")
    ap.add_argument("--partial", action="store_true", help="the job was cut short")
    ap.add_argument("--steps", type=int, help="step marks each rank made (idist::mark_step)")
    a = ap.parse_args()
    ranks = {int(r) for r in a.ranks.split(",")}
    nodes = {int(n) for n in a.nodes.split(",")}
    bad = []
    with open(a.file) as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        print("no traceEvents list")
        return 1
    for e in events:
        if e.get("ph") not in PHASES:
            bad.append(f"an event of unknown phase: {e}")
        elif e["ph"] == "X":
            if not isinstance(e.get("name"), str) or not isinstance(e.get("ts"), (int, float)) \
                    or not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0 \
                    or not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
                bad.append(f"a complete event without name, ts, dur >= 0, pid and tid: {e}")
    slices = [e for e in events if e["ph"] == "X"]
    collectives = [e for e in slices if e.get("cat") == "collective"]
    tracks = {(e["pid"], e["tid"]) for e in collectives}
    if collectives and ({t for _, t in tracks} != ranks or len(tracks) != len(ranks)):
        bad.append(f"collective tracks {sorted(tracks)}, not one per rank {sorted(ranks)}")
    if {e["pid"] for e in slices} != nodes:
        bad.append(f"processes {sorted({e['pid'] for e in slices})}, not the nodes {sorted(nodes)}")
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for t in tracks:
        if names.get(t) != f"rank {t[1]}":
            bad.append(f"track {t} is named {names.get(t)!r}, not 'rank {t[1]}'")
    for t in {(e["pid"], e["tid"]) for e in slices} - set(names):
        bad.append(f"track {t} has no name")
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    if procs != nodes:
        bad.append(f"process names for {sorted(procs)}, not the nodes {sorted(nodes)}")
    last, open_ = {}, defaultdict(list)  # per track: the last start, the slices still open
    for e in slices:
        t = (e["pid"], e["tid"])
        if t in last and e["ts"] < last[t]:
            bad.append(f"track {t}: ts {e['ts']} after {last[t]}")
            break
        last[t] = e["ts"]
        stack = open_[t]
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        if stack and e["ts"] + e["dur"] > stack[-1] + 0.002:  # printed to the ns
            bad.append(f"track {t}: the slice at {e['ts']} overlaps the one before without nesting")
            break
        stack.append(e["ts"] + e["dur"])
    flows = Counter(e["id"] for e in events if e["ph"] == "s")
    ends = Counter(e["id"] for e in events if e["ph"] == "f")
    if flows != ends or any(n != 1 for n in flows.values()):
        bad.append("flow starts and ends do not pair up by id")
    lost = doc.get("otherData", {}).get("lost_calls")
    if lost != 0:
        bad.append(f"otherData.lost_calls is {lost}, not 0")
    per_rank = Counter(e["tid"] for e in collectives)
    if a.calls is not None and any(per_rank[r] != a.calls for r in ranks):
        bad.append(f"collective calls per rank {dict(per_rank)}, not {a.calls} each")
    by_call = defaultdict(list)
    for e in collectives:
        by_call[e["args"]["call"]].append(e)
    for call, members in by_call.items():
        cut = a.partial and (len(members) < len(ranks) or any(m["args"]["state"] != "completed" for m in members))
        if not cut and (len(members) != len(ranks) or len({(m["name"], m["args"]["bytes"]) for m in members}) != 1):
            bad.append(f"call {call}: {len(members)} ranks, ops {sorted({m['name'] for m in members})}")
            break
    waited = Counter(e["args"].get("waited_for") for e in collectives if e["args"].get("waited_us", 0) > 1000)
    if a.slow is not None:
        top = waited.most_common(1)
        if not top or top[0][0] != f"rank {a.slow}":
            bad.append(f"the rank waited for most (over 1 ms) is {top}, not rank {a.slow}")
    marks = Counter(e["tid"] for e in events if e["ph"] == "i" and e.get("cat") == "step")
    if a.steps is not None and any(marks[r] != a.steps for r in ranks):
        bad.append(f"step marks per rank {dict(marks)}, not {a.steps} each")
    for b in bad[:10]:
        print(b)
    print(f"# {len(slices)} slices on {len(tracks)} tracks, {len(flows)} arrows; waited for: {dict(waited)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
