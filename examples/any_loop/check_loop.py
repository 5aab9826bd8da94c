"""Check nanogpt_loop.py's own loop: ``python check_loop.py`` (exit 0: its mechanics hold).

These ten lines are what a user adds next to their loop (docs/check.md, "Any loop").
``short_window=False``: nanoGPT samples its batches, so every step has ``accum_steps``
micro-batches and no epoch ends on a shorter window.
"""

import math

import torch
from nanogpt_loop import VOCAB, TinyGPT, get_batch, train_step

import stability.check

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
status = stability.check.loop(train_step, TinyGPT(), lambda model, batch: model(*batch)[1],
                              [get_batch(g) for _ in range(4)], accum_steps=4, scaler=True,
                              short_window=False, expected_init_loss=math.log(VOCAB))
raise SystemExit(status)
