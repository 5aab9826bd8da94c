"""nanoGPT's training loop, in the shape its ``train.py`` has it: top-level code.

Config as globals, the model (``nanogpt_loop.TinyGPT``), AdamW, a GradScaler, ``ctx``, a
``get_batch(split)`` of random windows, then ``X, Y = get_batch('train')`` and ``while True:``
with the LR set by hand, the micro-steps (``ddp`` flag, forward under ``ctx``, ``loss /
gradient_accumulation_steps``, the next batch fetched while this one trains, the scaled
backward), the clip after ``unscale_``, ``scaler.step``, ``update``, ``zero_grad(set_to_none=
True)`` (karpathy/nanoGPT train.py). ``python nanogpt_train.py`` trains;
``STABILITY_CHECK=1 python nanogpt_train.py`` checks the forward/backward/update lines as they
are (the four lines under the flag are all that was added).
"""

import math
import os
from contextlib import nullcontext

import torch
from nanogpt_loop import TinyGPT

gradient_accumulation_steps, batch_size, grad_clip = 4, 4, 1.0
learning_rate, max_iters, ddp, device_type, dtype = 3e-3, 20, False, "cpu", "float32"
torch.manual_seed(1337)
model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
ctx = nullcontext() if dtype == "float32" else torch.autocast(device_type, getattr(torch, dtype))
g = torch.Generator().manual_seed(1)


def get_batch(split):
    data = torch.randint(0, 32, (batch_size, 17), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


if os.environ.get("STABILITY_CHECK"):  # added: check lines 46-59 as written
    import stability.check
    raise SystemExit(stability.check.loop(f"{__file__}:46-59", model, lambda m, b: m(*b)[1], [
        get_batch("train") for _ in range(4)], scaler=True, short_window=False, scope=globals()))

X, Y = get_batch("train")
iter_num = 0
while True:
    lr = learning_rate * 0.5 * (1.0 + math.cos(math.pi * iter_num / max_iters))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > max_iters:
        break
print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}")
