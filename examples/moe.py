"""A small mixture-of-experts inference script (bf16 on a GPU): a transformer layer whose feed-forward is
four experts with top-2 routing, compiled with torch.compile and run a few steps under torch.no_grad().

    python examples/moe.py --mode reduce-overhead
"""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=64)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead (default: Inductor's default)")
args = parser.parse_args()

torch.manual_seed(0)


class MoE(torch.nn.Module):
    def __init__(self, width=128, hidden=256, experts=4):
        super().__init__()
        self.router = torch.nn.Linear(width, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(experts, width, hidden) / width**0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, width) / hidden**0.5)

    def forward(self, x):  # x: [tokens, width]
        logits = self.router(x)  # [tokens, experts]
        top, idx = logits.topk(2, dim=-1)  # [tokens, 2]
        gates = torch.zeros_like(logits).scatter(-1, idx, F.softmax(top.float(), -1).to(x.dtype))
        h = F.gelu(torch.einsum("td,edh->eth", x, self.w1))  # [experts, tokens, hidden]
        y = torch.einsum("eth,ehd->etd", h, self.w2)  # [experts, tokens, width]
        return torch.einsum("etd,te->td", y, gates)  # [tokens, width]


class Layer(torch.nn.Module):
    def __init__(self, width=128, heads=4):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.moe = MoE(width)

    def forward(self, x):  # x: [batch, seq, width]
        b, s, w = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [batch, heads, seq, head_dim]
        x = x + self.out(a.transpose(1, 2).reshape(b, s, w))
        return x + self.moe(self.n2(x).view(b * s, w)).view(b, s, w)


dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
model = Layer().to(device=args.device, dtype=dtype).eval()
compiled = torch.compile(model, mode=args.mode)
x = torch.randn(args.batch, args.seq, 128, device=args.device, dtype=dtype)
with torch.no_grad():
    for _ in range(args.steps):
        y = compiled(x)
print(f"moe: out {tuple(y.shape)} checksum {float(y.float().sum()):.4f}")
