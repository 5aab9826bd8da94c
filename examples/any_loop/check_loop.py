"""Check nanogpt_loop.py's own loop: ``python check_loop.py`` (exit 0: its mechanics hold).

These are the lines a user adds next to their loop (docs/check.md, "Any loop").
"""

import math

import torch
from nanogpt_loop import VOCAB, TinyGPT, get_batch, train_step

import stability.check

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
raise SystemExit(stability.check.loop(
    train_step, TinyGPT(), lambda model, batch: model(*batch)[1],
    [get_batch(g) for _ in range(4)], accum_steps=4, scaler=True,
    short_window=False,  # nanoGPT samples batches: every step has accum_steps micro-batches
    expected_init_loss=math.log(VOCAB)))
