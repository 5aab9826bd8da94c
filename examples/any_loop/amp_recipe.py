"""PyTorch's AMP recipe for gradient accumulation, as its docs write it: top-level code.

The loop below follows "Automatic Mixed Precision examples" (torch docs/source/notes/
amp_examples.rst, "Working with Scaled Gradients / Gradient accumulation"), with the
``unscale_`` + ``clip_grad_norm_`` of its "Gradient clipping" section where the accumulation
example says "may unscale_ here". The objects it uses (model, optimizer, loss_fn, data) are a
small classifier. ``python amp_recipe.py`` trains; ``STABILITY_CHECK=1 python amp_recipe.py``
checks the loop's lines as they are (the five lines under the flag are all that was added).
"""

import os

import torch
from torch import nn
from torch.amp import GradScaler, autocast

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(1)
data = [(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
        for _ in range(8)]
epochs, iters_to_accumulate, max_norm = range(3), 4, 1.0

if os.environ.get("STABILITY_CHECK"):  # added: check the loop below (lines 34-51) as written
    import stability.check
    raise SystemExit(stability.check.loop(f"{__file__}:34-51", model, lambda m, b: loss_fn(
        m(b[0]), b[1]), data, scaler=True, short_window=False, scope=globals(),
        names={"data": "batches", "iters_to_accumulate": "accum_steps"}))

scaler = GradScaler()

for epoch in epochs:  # noqa: B007 - as the recipe writes it
    for i, (input, target) in enumerate(data):
        with autocast(device_type="cuda", dtype=torch.float16):
            output = model(input)
            loss = loss_fn(output, target)
            loss = loss / iters_to_accumulate

        # the scaled gradients add up over the window
        scaler.scale(loss).backward()

        if (i + 1) % iters_to_accumulate == 0:
            # unscale before clipping, so the threshold applies to the true gradients
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
