"""PyTorch's DDP with model.join() on the uneven data of uneven_check.cpp's join cases: the
reference idist::join is compared with. Same model, parameters and batches, made from the same
formulas; run under idist-run (env://, gloo).

    idist-run -n 2 python3 ddp_join.py OUT [--world]   # --world: divide_by_initial_world_size=False
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

IN, HIDDEN, OUT = 12, 16, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(IN, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def fill(net):
    with torch.no_grad():
        for layer, p in enumerate(net.parameters()):
            flat = torch.arange(p.numel(), dtype=torch.float64)
            p.copy_((torch.sin(flat * 0.37 + layer) * 0.3).view(p.shape).to(p.dtype))


def batch(r, b):
    base = float(r * 100 + b)
    i = torch.arange(4 * IN, dtype=torch.float64).view(4, IN)
    x = torch.cos(i * 0.07 + base).float()
    y = torch.sin(torch.arange(4 * OUT, dtype=torch.float64).view(4, OUT) * 0.11 + base).float()
    return x, y


def batches_of(r):
    return 8 if r == 0 else 6 - (r - 1)


def main():
    out = sys.argv[1]
    divide_by_initial = "--world" not in sys.argv
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    net = Net()
    fill(net)
    model = DDP(net)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with model.join(divide_by_initial_world_size=divide_by_initial):
        for b in range(batches_of(rank)):
            x, y = batch(rank, b)
            sgd.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            sgd.step()
    if rank == 0:
        with open(out, "w") as f:
            for name, p in net.named_parameters():
                for v in p.detach().double().flatten().tolist():
                    f.write(f"{name} {v:.9g}\n")
    total = sum(p.detach().double().sum().item() for p in net.parameters())
    print(f"rank {rank}: parameters sum {total:.10g}", flush=True)
    # Every rank has written what it had; PyTorch's gloo teardown at 3 ranks sometimes never
    # returns on this machine (rank 0 spinning after the others left), so leave without it.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
