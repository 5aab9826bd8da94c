"""A training loop written the way nanoGPT's ``train.py`` writes one, on a tiny GPT.

``train_step`` is the body of nanoGPT's ``while True:`` loop, unchanged but for its name: the
forward under ``ctx``, ``loss / gradient_accumulation_steps``, ``scaler.scale(loss).backward()``
per micro-batch, then ``unscale_``, ``clip_grad_norm_``, ``scaler.step``, ``scaler.update`` and
``zero_grad(set_to_none=True)``. ``train`` is the loop around it (nanoGPT sets the LR by hand
each iteration). ``check_loop.py`` checks it with ``stability.check.loop``.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, BLOCK = 32, 16


class TinyGPT(nn.Module):
    """Token and position embeddings, one MLP block, an LM head: ``model(X, Y) -> (logits,
    loss)``, the loss a mean over the targets (``ignore_index=-1``), as nanoGPT's GPT."""

    def __init__(self, n_embd: int = 32) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, n_embd), nn.Embedding(BLOCK, n_embd)
        self.mlp = nn.Sequential(nn.LayerNorm(n_embd), nn.Linear(n_embd, 4 * n_embd),
                                 nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        logits = self.lm_head(x + self.mlp(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1),
                                       ignore_index=-1)


def get_batch(g: torch.Generator, batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random token sequences: inputs and their next tokens."""
    data = torch.randint(0, VOCAB, (batch_size, BLOCK + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def train_step(model, optimizer, scaler, batches, gradient_accumulation_steps, grad_clip, ctx):
    """One optimizer step: nanoGPT's forward/backward/update, as it writes it."""
    for micro_step in range(gradient_accumulation_steps):
        X, Y = batches[micro_step]
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)


def train(iters: int = 20, gradient_accumulation_steps: int = 4, grad_clip: float = 1.0,
          dtype: str = "float32", lr: float = 3e-3) -> float:
    """nanoGPT's loop around ``train_step`` (cosine LR set by hand); returns the last loss."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", enabled=(dtype == "float16"))
    ctx = (nullcontext() if dtype == "float32"
           else torch.autocast("cpu", dtype=getattr(torch, dtype)))
    for it in range(iters):
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * it / iters))
        batches = [get_batch(g) for _ in range(gradient_accumulation_steps)]
        train_step(model, optimizer, scaler, batches, gradient_accumulation_steps, grad_clip,
                   ctx)
    with torch.no_grad():
        return float(model(*get_batch(g))[1])


if __name__ == "__main__":
    print(f"loss after 20 steps on random tokens: {train():.3f} (log {VOCAB} = "
          f"{math.log(VOCAB):.3f})")
