"""A sweep's grid as points: each job's overrides, its validated config and its identity.

Two grid points are the same experiment when their canonical configs and seeds match
(``stability.core.identity.fingerprint``): with clipping off, every ``clip.max_norm`` value trains
the identical model, so such a point is launched once, not once per threshold. Overrides
that cannot matter for a point are dropped before launch so the recorded override string
says what the run really was.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from stability.core.config import RunConfig
from stability.core.identity import canonical, fingerprint, flatten

T = TypeVar("T")


@dataclass(frozen=True)
class SweepPoint:
    """One job of a sweep: its Hydra overrides and the config they compose to."""

    overrides: tuple[str, ...]
    cfg: RunConfig
    fingerprint: str

    @property
    def key(self) -> tuple[str, int]:
        """``(fingerprint, seed)``: the identity used for de-duplication and resume."""
        return self.fingerprint, self.cfg.seed


def override_key(override: str) -> str:
    """The dotted key of ``key=value`` without Hydra's ``+``/``++``/``~`` prefixes."""
    return override.split("=", 1)[0].lstrip("+~")


def irrelevant_keys(cfg: RunConfig) -> set[str]:
    """Dotted keys whose value cannot influence this run (normalised to None by ``canonical``)."""
    flat, canon = flatten(cfg), canonical(cfg)
    return {k for k, v in canon.items() if v is None and flat.get(k) is not None}


def make_point(overrides: Sequence[str], cfg: RunConfig) -> SweepPoint:
    """A ``SweepPoint`` whose overrides omit settings that cannot matter for ``cfg``.

    Args:
        overrides: the job's Hydra overrides, e.g. ``["clip.enabled=false", "clip.max_norm=5"]``.
        cfg: the config those overrides compose to.
    """
    drop = irrelevant_keys(cfg)
    kept = tuple(o for o in overrides if override_key(o) not in drop)
    return SweepPoint(kept, cfg, fingerprint(cfg))


def dedupe(points: Iterable[SweepPoint]) -> list[SweepPoint]:
    """The first point of each ``(fingerprint, seed)``, in grid order."""
    seen: set[tuple[str, int]] = set()
    unique: list[SweepPoint] = []
    for p in points:
        if p.key not in seen:
            seen.add(p.key)
            unique.append(p)
    return unique


def chunks(items: Sequence[T], size: int) -> list[list[T]]:
    """``items`` in consecutive batches of at most ``size`` (``size < 1``: one batch)."""
    if size < 1:
        return [list(items)] if items else []
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
