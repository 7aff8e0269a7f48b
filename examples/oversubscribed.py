"""CPU inference in a container that reports more cores than it may use.

Inductor hard-codes its OpenMP thread count into the C++ kernels it generates. Here the count is
four times the usable cores (what happens when os.cpu_count() sees the host, not the container's
quota), so every parallel region oversubscribes the CPU. The tuner can find that: it tries other
thread counts per kernel and the gate measures the result. `make demo` runs this script.
"""

import argparse
import os

import torch

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
torch._inductor.config.cpp.threads = 4 * cores
torch.manual_seed(0)  # the parameters below are the same in every process


class Scorer(torch.nn.Module):
    def __init__(self, width=1024):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):  # x: [rows, width]
        gate = torch.sigmoid(x.mean(0))  # [width]
        return torch.softmax(x * self.scale, dim=-1) * gate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    model = Scorer().eval()
    compiled = torch.compile(model)
    x = torch.randn(256, 1024)
    with torch.no_grad():
        for _ in range(args.steps):
            y = compiled(x)
    print(f"oversubscribed: {torch._inductor.config.cpp.threads} OpenMP threads on {cores} cores, "
          f"checksum {float(y.sum()):.4f}")


if __name__ == "__main__":
    main()
