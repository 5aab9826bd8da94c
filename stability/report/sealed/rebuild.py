"""A recorded run's model, rebuilt only when its checkpoint fits it: sized on ``meta`` first.

A run's ``config.yaml`` is data (``report/evidence/trust.py``): ``model.hidden_size=200000`` passes
every check a string can have and would allocate hundreds of GiB when built. So the model is built
first on PyTorch's ``meta`` device (shapes, no memory), its ``state_dict`` names and shapes are
compared with the checkpoint's tensors (already in memory, bounded by the file), and the buffers
it would hold without saving them are bounded; only then is it built for real and loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from stability.core.loop import CHECKPOINT_NAME

# Elements a model may hold outside its checkpoint (buffers it does not save, e.g. a causal
# mask): the built-in tasks' largest is char_lm's mask, seq_len^2 (1,024 at its default).
MAX_UNSAVED_ELEMENTS = 100_000_000
_SHOWN = 3  # names listed per kind of mismatch


# What torch.load may inflate a checkpoint to: the members of the zip archive torch.save
# writes (stored, uncompressed) summed; the built-in tasks' models are under 1 MB.
MAX_CHECKPOINT_BYTES = 2**30
# Members of that archive: torch.save writes one per tensor storage and 6 more (data.pkl,
# version, byteorder...); Llama-2-7B's state_dict has 291 tensors. 300k empty members loaded
# (each a ZipInfo, the whole central directory parsed) before this cap: it is read from the
# archive's end record first, with the central directory's size (what ZipFile iterates by).
MAX_CHECKPOINT_MEMBERS = 10_000
MAX_CENTRAL_DIRECTORY_BYTES = 512 * MAX_CHECKPOINT_MEMBERS  # a member's record: ~70 B + name


class CheckpointMismatch(ValueError):
    """A checkpoint whose tensors are not the rebuilt model's (the reason names them)."""


def check_archive(path: Any) -> None:
    """Before ``torch.load``: ``path`` is the zip archive ``torch.save`` writes, of at most
    ``MAX_CHECKPOINT_MEMBERS`` members stored uncompressed and together at most
    ``MAX_CHECKPOINT_BYTES``.

    A DEFLATE-compressed member of 0.97 MB inflates to 1 GB inside ``torch.load`` (with
    ``weights_only=True`` too), before any shape is compared: the sizes the archive declares
    are read first (``zipfile.ZipInfo.file_size``).

    Raises:
        CheckpointMismatch: not such an archive (the reason says how).
    """
    import zipfile

    name = CHECKPOINT_NAME
    if not zipfile.is_zipfile(path):
        raise CheckpointMismatch(f"{name} is not the zip archive torch.save writes")
    with open(path, "rb") as f:  # the numbers ZipFile itself reads, before it reads members
        end = zipfile._EndRecData(f)  # type: ignore[attr-defined]
    members = end[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
    directory = end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    if members > MAX_CHECKPOINT_MEMBERS or directory > MAX_CENTRAL_DIRECTORY_BYTES:
        raise CheckpointMismatch(
            f"{name} declares {members:,} members in a {directory:,}-byte directory, over the "
            f"report's cap of {MAX_CHECKPOINT_MEMBERS:,} members ({MAX_CENTRAL_DIRECTORY_BYTES:,}"
            " bytes)")
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
    packed = [m.filename for m in members if m.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise CheckpointMismatch(f"{name} holds compressed members ({_names(packed)}), which "
                                 "torch.save never writes")
    total = sum(m.file_size for m in members)
    if total > MAX_CHECKPOINT_BYTES:
        raise CheckpointMismatch(f"{name} declares {total:,} bytes, over the report's cap of "
                                 f"{MAX_CHECKPOINT_BYTES:,}")


def _shapes(state: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            for k, v in state.items()}


def _names(keys: list[str]) -> str:
    more = f" (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def fitted(make: Callable[[], nn.Module], state: Any) -> nn.Module:
    """``make()`` with ``state`` loaded, once the checkpoint is known to fit it.

    Args:
        make: builds a fresh model (the task's ``model``, or a trainer's module).
        state: the checkpoint, as ``torch.load(..., weights_only=True)`` returned it.

    Raises:
        CheckpointMismatch: ``state`` is not a mapping of the model's tensor names to tensors
            of its shapes, or the model holds more than ``MAX_UNSAVED_ELEMENTS`` elements
            outside it. Nothing but the ``meta`` model is built before.
    """
    if not isinstance(state, Mapping):
        raise CheckpointMismatch(f"{CHECKPOINT_NAME} is a {type(state).__name__}, not a "
                                 "state_dict (allowed: a mapping of names to tensors)")
    with torch.device("meta"):  # factories and nn.Module parameters land on meta: no memory
        shell = make()
    want, have = _shapes(shell.state_dict()), _shapes(state)
    if want != have:
        parts = [f"{label}: {_names(keys)}" for label, keys in (
            ("missing", sorted(want.keys() - have.keys())),
            ("unexpected", sorted(have.keys() - want.keys())),
            ("other shapes", [f"{k} {have[k]} for {want[k]}" for k in sorted(want.keys()
                              & have.keys()) if want[k] != have[k]])) if keys]
        raise CheckpointMismatch(f"{CHECKPOINT_NAME} does not fit the model its config.yaml "
                                 f"builds ({'; '.join(parts)})")
    unsaved = sum(b.numel() for name, b in shell.named_buffers() if name not in want)
    if unsaved > MAX_UNSAVED_ELEMENTS:
        raise CheckpointMismatch(f"the model its config.yaml builds holds {unsaved:,} elements "
                                 f"outside {CHECKPOINT_NAME}: allowed values are at most "
                                 f"{MAX_UNSAVED_ELEMENTS:,}")
    del shell
    model = make()
    model.load_state_dict(state)
    return model
