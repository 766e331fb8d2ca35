# The shape of scripts written for `python -m torch.distributed.launch` without --use-env (the
# default before torchrun) and for DeepSpeed's launcher: the local rank arrives as an argument,
# --local_rank=N, read by argparse with a default of 0; everything else comes from env://.
# Without the argument every rank takes itself for local rank 0 (all on cuda:0, say) and the
# job still exits 0: the sum of local_rank + 1 below tells.
import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()
t = torch.tensor([args.local_rank + 1])
dist.all_reduce(t)
print(f"rank {rank}: --local_rank={args.local_rank} epochs={args.epochs} sum of local ranks + 1: {t.item()}", flush=True)
dist.destroy_process_group()
