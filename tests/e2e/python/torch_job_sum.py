"""torch.distributed as users write it (env://, gloo), with the job's own input: every rank adds
(rank + 1) * VALUE, ROUNDS times, pausing between rounds so that two jobs started together
overlap. torch checks no job token, so this is the program that would mix two jobs' sums if
they shared rank 0's store. Prints one line per rank; exits 3 on any wrong sum.
usage: torch_job_sum.py [ROUNDS] VALUE   (the value last, so a test can append it)
JOB_SUM_CRASH=RANK:ROUND: in attempt 0 (IDIST_RESTART_COUNT) that rank exits with code 7 before
that round, while the others compute, as tests/e2e/job_sum.cpp does."""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    value = int(sys.argv[-1])
    rounds = int(sys.argv[1]) if len(sys.argv) > 2 else 10
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    want = value * world * (world + 1) // 2
    wrong = 0
    attempt = int(os.environ.get("IDIST_RESTART_COUNT", "0"))
    crash = os.environ.get("JOB_SUM_CRASH", "")
    crash_rank, crash_round = (int(v) for v in crash.split(":")[:2]) if crash and attempt == 0 else (-1, 0)
    for i in range(rounds):
        if rank == crash_rank and i == crash_round:
            print(f"torch_job_sum: rank {rank} crashes before round {i} (JOB_SUM_CRASH)", file=sys.stderr, flush=True)
            os._exit(7)
        x = torch.tensor([value * (rank + 1)], dtype=torch.int64)
        dist.all_reduce(x)
        wrong += int(x.item() != want)
        time.sleep(0.03)
    verdict = "right" if wrong == 0 else f"WRONG in {wrong} rounds, want {want}"
    print(f"torch job {value} rank {rank}/{world} port {os.environ['MASTER_PORT']} attempt {attempt} sum {x.item()} {verdict}",
          flush=True)
    dist.destroy_process_group()
    sys.exit(0 if wrong == 0 else 3)


if __name__ == "__main__":
    main()
