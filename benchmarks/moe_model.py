"""The MoE of moe_benchmark.py, built here so that the model suite (models.py) builds the same one: a
deterministic BF16 top-2 mixture-of-experts transformer, 8 sequences x 128 tokens, width 256, 8 heads,
4 experts of hidden width 512, vocabulary 2048, 2 layers, routing computed densely (static shapes)."""

from __future__ import annotations


def build(device: str):
    import torch
    import torch.nn.functional as F

    class MoE(torch.nn.Module):
        def __init__(self, width=256, hidden=512, experts=4):
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
            return torch.einsum("etd,te->td", y, gates)

    class Layer(torch.nn.Module):
        def __init__(self, width=256, heads=8):
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

    class Model(torch.nn.Module):
        def __init__(self, vocab=2048, width=256, layers=2):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, width)
            self.layers = torch.nn.ModuleList(Layer(width) for _ in range(layers))
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, vocab, bias=False)

        def forward(self, tokens):  # tokens: [batch, seq] int64
            x = self.emb(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))  # [batch, seq, vocab]

    torch.manual_seed(0)
    model = Model().to(device=device, dtype=torch.bfloat16).eval()
    tokens = torch.randint(0, 2048, (8, 128), generator=torch.Generator().manual_seed(1)).to(device)
    return model, tokens
