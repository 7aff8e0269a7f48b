"""A small inference script: an MLP block under torch.no_grad(), compiled with torch.compile."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
args = parser.parse_args()

torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, width=128):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):  # x: [batch, width]
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(x + h, dim=-1)


model = Block().to(args.device).eval()
compiled = torch.compile(model, mode=args.mode)
x = torch.randn(args.batch, 128, device=args.device)
with torch.no_grad():
    for _ in range(args.steps):
        y = compiled(x)
print(f"inference: out {tuple(y.shape)} checksum {float(y.sum()):.4f}")
