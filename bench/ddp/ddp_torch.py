#!/usr/bin/env python3
"""The Python side of bench/ddp/run.sh: PyTorch's DistributedDataParallel (gloo, its defaults)
on the same networks, batch, data shapes, optimizer and threads as ddp_idist.cpp.

    idist-run -n 2 python3 ddp_torch.py --model resnet18 --batch 16 --mode ddp
    python3 ddp_torch.py --model resnet18 --batch 16 --mode single

Rank 0 prints one JSON line, as ddp_idist does.
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    # The same as apps/examples/resnet.hpp's, layer for layer.
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet18(nn.Module):
    def __init__(self, classes=10, width=64):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(8 * width, classes)
        blocks, cin = [], width
        for stage in range(4):
            cout = width << stage
            for block in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and block == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)

    def forward(self, x):
        y = F.relu(self.bn(self.stem(x)))
        y = self.layers(y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4096, 4096)
        self.fc2 = nn.Linear(4096, 4096)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["resnet18", "mlp"], default="resnet18")
    parser.add_argument("--mode", choices=["ddp", "single"], default="ddp")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    rank, world = 0, 1
    if args.mode == "ddp":
        dist.init_process_group("gloo", init_method="env://")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    if args.model == "resnet18":
        model = ResNet18()
        x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(10, (args.batch,))
        loss_of = F.cross_entropy
    else:
        model = Mlp()
        x, y = torch.randn(args.batch, 4096), torch.randn(args.batch, 4096)
        loss_of = F.mse_loss
    parameters = sum(p.numel() for p in model.parameters())
    if args.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    times = []
    phases = {name: [] for name in ("zero_grad", "forward", "backward", "step")}  # as ddp_idist's
    for step in range(args.warmup + args.steps):
        at = [time.perf_counter()]
        optimizer.zero_grad()
        at.append(time.perf_counter())
        loss = loss_of(model(x), y)
        at.append(time.perf_counter())
        loss.backward()
        at.append(time.perf_counter())
        optimizer.step()
        at.append(time.perf_counter())
        if step >= args.warmup:
            times.append((at[-1] - at[0]) * 1e3)
            for i, name in enumerate(phases):
                phases[name].append((at[i + 1] - at[i]) * 1e3)
    if rank == 0:
        print(json.dumps({"impl": "torch", "mode": args.mode, "model": args.model, "parameters": parameters,
                          "ranks": world, "batch_per_rank": args.batch, "torch": torch.__version__,
                          "step_ms_median": statistics.median(times), "step_ms": [round(t, 3) for t in times],
                          "phase_ms_median": {k: round(statistics.median(v), 3) for k, v in phases.items()}}))
    if args.mode == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
