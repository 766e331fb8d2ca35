#!/usr/bin/env python3
"""The reference beside `idist-bench --backend nccl` on one GPU: the same collectives, sizes and
timing through PyTorch's own ProcessGroupNCCL (torch.distributed, a world of one), and the
GPU's device-to-device copy bandwidth, the ceiling any data movement on one GPU can reach.

Timed as idist-bench times (apps/idist-bench/harness.hpp): each call is preceded, outside the
clock, by a restore of its in-place input (a copy on the GPU) or a poison of its output, and
timed alone up to its completion (torch's calls return before the GPU is done, so the clock
stops after torch.cuda.synchronize(); idist's calls return when done). As many calls as fit in
--time-per-size seconds, preparation included, 5 to 20,000. The last call's result is checked.

    python3 bench/torch_nccl_ref.py -b 8 -e 1G --json OUT.json
"""

import argparse
import json
import os
import statistics
import sys
import time

COLLECTIVES = ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "reduce", "barrier"]
MIN_ITERS, MAX_ITERS = 5, 20000


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--min-bytes", type=size, default=8)
    parser.add_argument("-e", "--max-bytes", type=size, default=1 << 30)
    parser.add_argument("-f", "--step-factor", type=int, default=2)
    parser.add_argument("-w", "--warmup-iters", type=int, default=5)
    parser.add_argument("-t", "--time-per-size", type=float, default=0.2)
    parser.add_argument("--json", help="write the results here as well")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("torch_nccl_ref: SKIPPED: torch sees no CUDA device", file=sys.stderr)
        return 77
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)

    def timed(prepare, call):
        start = time.perf_counter()
        for _ in range(args.warmup_iters):
            prepare()
            call()
            torch.cuda.synchronize()
        per_iter = (time.perf_counter() - start) / args.warmup_iters
        iters = int(min(max(args.time_per_size / max(per_iter, 1e-9), MIN_ITERS), MAX_ITERS))
        calls = []
        for _ in range(iters):
            prepare()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            calls.append((time.perf_counter() - t0) * 1e6)
        return statistics.fmean(calls), statistics.median(calls), iters

    sizes = []
    b = args.min_bytes
    while b <= args.max_bytes:
        sizes.append(b)
        b *= args.step_factor

    rows = []
    header = f"{'collective':>14} {'size (B)':>12} {'time (us)':>10} {'median':>10} {'algbw (GB/s)':>13} {'#wrong':>7} {'iters':>6}"
    print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
          f"{torch.cuda.get_device_name(device)}, a world of one")
    print(header)
    for name in COLLECTIVES:
        for nbytes in ([0] if name == "barrier" else sizes):
            count = nbytes // 4
            if name != "barrier" and count == 0:
                continue
            pristine = torch.arange(count, device=device, dtype=torch.float32).remainder_(251)
            work = torch.empty_like(pristine)
            out = torch.empty_like(pristine)
            restore = lambda: work.copy_(pristine)
            poison = lambda: out.fill_(float("nan"))
            if name == "all_reduce":
                mean, median, iters = timed(restore, lambda: dist.all_reduce(work))
                result = work
            elif name == "reduce":
                mean, median, iters = timed(restore, lambda: dist.reduce(work, dst=0))
                result = work
            elif name == "broadcast":
                mean, median, iters = timed(restore, lambda: dist.broadcast(work, src=0))
                result = work
            elif name == "all_gather":
                mean, median, iters = timed(poison, lambda: dist.all_gather_into_tensor(out, pristine))
                result = out
            elif name == "reduce_scatter":
                mean, median, iters = timed(poison, lambda: dist.reduce_scatter_tensor(out, pristine))
                result = out
            else:
                mean, median, iters = timed(lambda: None, lambda: dist.barrier(device_ids=[0]))
                result = None
            wrong = 0 if result is None else int((result != pristine).sum().item())
            algbw = nbytes / (mean * 1e3) if mean > 0 else 0.0
            rows.append({"collective": name, "bytes": nbytes, "count": count, "dtype": "float32",
                         "time_us": mean, "median_us": median, "algbw_GBps": algbw, "wrong": wrong, "iters": iters})
            print(f"{name:>14} {nbytes:>12} {mean:>10.2f} {median:>10.2f} {algbw:>13.2f} {wrong:>7} {iters:>6}",
                  flush=True)
            del pristine, work, out

    # The ceiling: a device-to-device copy of the largest size, bytes read plus written.
    src = torch.empty(args.max_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    copies = 20
    for _ in range(copies):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = begin.elapsed_time(end) / 1e3 / copies
    copy = {"bytes": args.max_bytes, "seconds": seconds, "read_plus_write_GBps": 2 * args.max_bytes / seconds / 1e9}
    print(f"# device-to-device copy of {args.max_bytes} B: {seconds * 1e6:.1f} us, "
          f"{copy['read_plus_write_GBps']:.0f} GB/s counting bytes read and written")

    dist.destroy_process_group()
    wrong = sum(r["wrong"] for r in rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"program": "torch_nccl_ref", "torch": torch.__version__,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                       "device": torch.cuda.get_device_name(device), "world_size": 1,
                       "time_per_size": args.time_per_size, "results": rows, "copy": copy}, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
