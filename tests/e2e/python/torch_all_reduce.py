"""A torch.distributed script as users write it for torchrun: env:// and gloo, nothing of
idist's. Every rank holds [1, 2] + 2*rank; after a SUM over N ranks every rank holds
[N^2, N^2 + N] (the seed tutorial's all_reduce)."""
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    tensor = torch.tensor([1, 2]) + 2 * rank
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    want = [world * world, world * world + world]
    ok = tensor.tolist() == want
    print(f"Rank {rank}/{world} local_rank {os.environ['LOCAL_RANK']} args {sys.argv[1:]}: "
          f"all_reduce {tensor.tolist()} {'right' if ok else 'WRONG, want ' + str(want)}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
