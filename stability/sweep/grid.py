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


@dataclass(frozen=True)
class Axis:
    """One swept key of the grid: its values as written, and where it comes from."""

    key: str
    values: str  # e.g. "1,2,4,8"
    count: int
    from_study: bool  # the default study's (hydra.sweeper.params), not given on the command line


def grid_axes(study: Sequence, given: Sequence) -> list[Axis]:
    """The swept keys of a grid (Hydra ``Override`` objects of the study, then of the command
    line; a key given on the command line replaces the study's, as in ``split_arguments``)."""
    merged = {o.get_key_element(): (o, False) for o in study}
    merged |= {o.get_key_element(): (o, True) for o in given}
    return [Axis(key.lstrip("+~"), o.input_line.partition("=")[2],
                 len(list(o.sweep_string_iterator())), not on_line)
            for key, (o, on_line) in merged.items()
            if o.is_sweep_override() and o.is_discrete_sweep()]


def axes_lines(axes: Sequence[Axis]) -> list[str]:
    """What the sweep will run, before its first job: the axes given on the command line,
    those kept from the default study (narrowing a grid keeps them), and the planned count."""
    def listed(group: list[Axis]) -> str:
        return ", ".join(f"{a.key}={a.values}" for a in group)

    given = [a for a in axes if not a.from_study]
    study = [a for a in axes if a.from_study]
    lines = [f"axes given: {listed(given)}"] if given else []
    if study:
        lines.append(f"axes from the study config (hydra.sweeper.params, not given on the "
                     f"command line; give key=value to fix one): {listed(study)}")
    planned = 1
    for a in axes:
        planned *= a.count
    product = " x ".join(f"{a.count} {a.key}" for a in axes) or "no swept key"
    lines.append(f"planned: {planned} grid points ({product})")
    return lines
