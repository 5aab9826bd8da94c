"""A loop as published: top-level code, checked from its own file without a rewrite.

Recipes (PyTorch's AMP examples, nanoGPT's ``train.py``) write the training loop as top-level
code, not a function. ``stability.check.loop("train.py:120-140", ...)`` takes those lines of
the file as they are: one run of them is one optimizer step (nanoGPT's ``while True:`` body),
or one pass over ``data`` (the AMP recipe's ``for i, (input, target) in enumerate(data):``,
stepping every ``iters_to_accumulate``). The lines are dedented, compiled with their own file
name and line numbers (an error names ``train.py:131``), and run with the names they read bound
to each probe's fresh objects: the names ``anyloop.SUPPLIED`` knows (``epochs`` is one pass),
``names`` mapping the loop's own names onto them; everything else from ``scope`` (the user's
own objects: ``loss_fn``, ``autocast``; ``scope=globals()`` from the script itself), and
``torch``. ``get_batch(...)`` returns the window's micro-batches in turn, and ``X``, ``Y``
start as its first (nanoGPT fetches the next batch while the current one trains).
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from stability.core.validation import ConfigError, require


def lines_of(spec: str) -> tuple[Path, int, int] | None:
    """``file.py:START-END`` as (file, start, end); None for any other spelling."""
    file, sep, span = spec.rpartition(":")
    start, dash, end = span.partition("-")
    if not sep or not dash or not start.isdigit() or not end.isdigit():
        return None
    return Path(file), int(start), int(end)


def _compile(file: Path, start: int, end: int) -> tuple[Any, set[str], set[str]]:
    # the lines dedented, compiled under their file's name and numbers; the names they read
    # and the names they bind
    key = f"train_step={file}:{start}-{end}"
    require(file.is_file(), "train_step", f"{file}:{start}-{end}", "an existing file.py:START-END")
    text = file.read_text().splitlines()
    require(1 <= start <= end <= len(text), "train_step", f"{file}:{start}-{end}",
            f"lines within 1-{len(text)} of {file.name}")
    source = textwrap.dedent("\n".join(text[start - 1 : end]))
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as err:
        line = (err.lineno or 1) + start - 1
        raise ConfigError(f"{key} is invalid: {file.name}:{line}: SyntaxError: {err.msg} (the "
                          "lines must be whole statements)") from None
    ast.increment_lineno(tree, start - 1)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store | ast.Del)}
    return compile(tree, str(file.resolve()), "exec"), read, bound


def step_of_lines(file: Path, start: int, end: int, supplied: Mapping[str, Callable[..., Any]],
                  names: Mapping[str, str] | None = None,
                  scope: Mapping[str, Any] | None = None) -> tuple[Callable[..., bool],
                                                                   set[str]]:
    """The lines as a probe's step function, and the supplied names they receive.

    Raises:
        ConfigError: the file or lines do not exist, do not parse, or read a name that is
            neither bound in them, supplied, in ``scope``, ``torch`` nor a builtin.
    """
    code, read, bound = _compile(file, start, end)
    names, scope = dict(names or {}), dict(scope or {})
    own = {"torch", "get_batch", "X", "Y"}
    wired = {n: names.get(n, n) for n in read if names.get(n, n) in supplied}
    loose = sorted(n for n in read - bound - set(wired) - set(scope) - own
                   if not hasattr(builtins, n))
    if loose:
        raise ConfigError(f"the loop at {file.name}:{start}-{end} reads {', '.join(loose)}, "
                          "which the check does not supply: allowed values are "
                          + " | ".join(supplied) + " (or map it: names={...}, or pass it: "
                          "scope={...})")

    seen: dict[Any, Any] = {}  # one warnings registry: a warning of the loop's prints once

    def step(rig: Any, window: Sequence[Any]) -> bool:
        fired: list[int] = []
        handle = rig.optimizer.register_step_post_hook(lambda *_: fired.append(1))
        batches = list(window)
        turn = iter(batches[1:] + batches * 2)

        def get_batch(*_: Any, **__: Any) -> Any:
            return next(turn)

        ns: dict[str, Any] = {"__builtins__": builtins, "torch": torch, **scope,
                              "__warningregistry__": seen, "get_batch": get_batch}
        if isinstance(batches[0], list | tuple) and len(batches[0]) == 2:
            ns["X"], ns["Y"] = batches[0]
        ns.update({n: supplied[s](rig, window) for n, s in wired.items()})
        try:
            exec(code, ns)  # noqa: S102 - the user's own loop, by their own call
        finally:
            handle.remove()
        return bool(fired)

    return step, set(wired.values())
