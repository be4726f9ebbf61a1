"""A plain PyTorch training loop of the dense GPT shape, the reference for bench.torch_compare.

    .venv-torch/bin/python bench/torch_loop.py --seconds 20 [--batch 12 --context 64 ...]

Runs alone under a Python that has torch (``make bench-torch`` makes ``.venv-torch``; torch is a bench-only
extra, never a dependency of the pipeline) and imports nothing from the project, so it can run under another
Python version. The model is the Trainer's dense switch written again in PyTorch: pre-norm RMSNorm blocks,
causal multi-head attention with half-split RoPE on the whole head, SwiGLU feed-forward, untied embedding and
head; AdamW (beta 0.9 / 0.95, weight decay 0.1 on matrices), global-norm clipping at 1, float32, eager mode (a
plain loop, as nanoGPT runs on a CPU without torch.compile). Prints one JSON line: steady tokens/s after the
first two steps, the step count and the torch version.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812  (PyTorch's own convention)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.scale = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def rope(x, cos, sin):
    """x [B, H, T, d]; half-split pairs (i, i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, inter: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.attn_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.wqkv, self.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, inter, bias=False), nn.Linear(d, inter, bias=False)
        self.w2 = nn.Linear(inter, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        out = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.wo(out)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, inter: int, context: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, inter) for _ in range(layers))
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        head_dim = d // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.arange(context).float()[:, None] * inv[None, :]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--vocab", type=int, default=65)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--inter", type=int, default=344)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.inter, args.context)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.95))
    data = torch.randint(0, args.vocab, (256 * args.batch, args.context + 1))

    def step(i):
        rows = data[(i * args.batch) % (len(data) - args.batch):][:args.batch]
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), rows[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss)

    for i in range(2):
        step(i)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        step(steps + 2)
        steps += 1
    seconds = time.perf_counter() - start
    print(json.dumps({"tokens_per_second": steps * args.batch * args.context / seconds, "steps": steps,
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
