"""The study's factor vocabulary: one registry entry per first-class factor.

A first-class factor (clipping, accumulation, precision) owns some params, reads its level
from a config's params, and knows its title, how its levels sort (the first is the reference),
how a level is named in sentences and how simple it is (the tie-break of the decision). Any
other param the sweep swept (``train.lr``, ``optim.weight_decay``) is a plain factor: named
by its key, levels numeric first, none simpler than another. Adding a first-class factor is
one ``Kind`` in ``FIRST_CLASS``: the sweep's adaptive strategy, the factor effects, the
decision, the replay and the heatmap's panels all read it from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The params a first-class factor's level is read from: spelled once, in ``core.identity``,
# whose config label names them too (the run's MLflow name is made below this layer).
from stability.core.identity import (
    ACCUM_STEPS,
    CLIP_ENABLED,
    CLIP_METHOD,
    CLIP_VALUE,
    MAX_NORM,
    PRECISION_NAME,
)
from stability.core.precision import SIMPLEST_FIRST

CLIP, ACCUM, PRECISION = "clipping", "accumulation", "precision"

Params = Mapping[str, Any]  # one config's params as dotted keys (``core.identity.flatten``)


def flag(value: Any) -> bool:
    """A boolean param as a config or an MLflow string (``"True"``) carries it."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def _number_first(level: str) -> tuple:
    """Numbers in increasing order, then any other level by its text."""
    try:
        return (0, float(level), level)
    except ValueError:
        return (1, 0.0, level)


def _clip_level(p: Params) -> str:
    if not flag(p.get(CLIP_ENABLED, False)):
        return "off"
    if p.get(CLIP_METHOD, "norm") == "value":
        return f"value {float(p[CLIP_VALUE]):g}"
    return f"max_norm {float(p[MAX_NORM]):g}"


def _clip_order(level: str) -> tuple:
    on = level != "off"
    return (on, level.split()[0], float(level.split()[-1]) if on else 0.0)


PRECISIONS = tuple(str(p) for p in SIMPLEST_FIRST)  # the precisions a loop knows, simplest first


def precision_rank(level: Any) -> int:
    """fp32 0, bf16 1, fp16 2 (``core.precision.SIMPLEST_FIRST``); any other name after them."""
    return PRECISIONS.index(str(level)) if str(level) in PRECISIONS else len(PRECISIONS)


@dataclass(frozen=True)
class Kind:
    """What a factor is: its params, title, level order, level names and simplicity.

    Attributes:
        name: the factor's name in tables and effects (``accumulation``).
        title: its heading (``Accumulation``).
        params: the params it owns (a trailing ``.`` owns the group): never a plain factor.
        axis: the param a figure's axis is labelled with (``train.accum_steps``).
        level: a config's level from its params (``None``: a plain factor, the param's value).
        order: the sort key of a level; the first level is the reference.
        label: a level's name in sentences (``accum 8``, ``clip off``).
        simplest: a level's simplicity from its name and position (0: simplest).
        heatmap: where the loss heatmap puts it: ``rows``, ``columns`` or ``panels`` (one
            panel per combination of the panel factors' levels).
        keys: the params its level is read from (``params`` may own more): a config's label
            names them, so the report never adds them to a label to tell configs apart.
        known: the levels a loop knows, simplest first (the report's "best of each"); empty:
            none named in advance.
        tie_break: its place in the selection rule's tie-break between configs with equal
            means (lower first); None: no part in it.
        simpler: that tie-break in words (``clip off before on``).
    """

    name: str
    title: str
    params: tuple[str, ...]
    axis: str
    level: Callable[[Params], str] | None = None
    order: Callable[[str], tuple] = _number_first
    label: Callable[[str], str] | None = None
    simplest: Callable[[str, int], int] = lambda level, position: 0
    heatmap: str = "panels"
    keys: tuple[str, ...] = ()
    known: tuple[str, ...] = ()
    tie_break: int | None = None
    simpler: str = ""

    def owns(self, param: str) -> bool:
        """Whether ``param`` is one of this factor's params (a group prefix owns its keys)."""
        return any(param == p or (p.endswith(".") and param.startswith(p)) for p in self.params)

    def name_of(self, level: str) -> str:
        """The level as sentences name it: ``accum 8``, ``max_norm 5``, ``train.lr=0.01``."""
        return self.label(level) if self.label is not None else f"{self.name}={level}"


FIRST_CLASS: tuple[Kind, ...] = (
    Kind(name=CLIP, title="Clipping", params=("clip.",), axis="clipping", level=_clip_level,
         order=_clip_order, label=lambda lv: "clip off" if lv == "off" else lv,
         simplest=lambda lv, _: 0 if lv == "off" else 1, heatmap="rows",
         keys=(CLIP_ENABLED, CLIP_METHOD, MAX_NORM, CLIP_VALUE), tie_break=0,
         simpler="clip off before on"),
    Kind(name=ACCUM, title="Accumulation", params=(ACCUM_STEPS,), axis=ACCUM_STEPS,
         level=lambda p: str(int(p.get(ACCUM_STEPS, 1))),
         label=lambda lv: f"accum {lv}", simplest=lambda _, position: position,
         heatmap="columns", keys=(ACCUM_STEPS,), tie_break=2, simpler=f"smaller {ACCUM_STEPS}"),
    Kind(name=PRECISION, title="Precision", params=("precision.",), axis="precision",
         level=lambda p: str(p.get(PRECISION_NAME, "")),
         order=lambda lv: (precision_rank(lv), lv), label=lambda lv: lv,
         simplest=lambda _, position: position, keys=(PRECISION_NAME,), known=PRECISIONS,
         tie_break=1, simpler=" before ".join(PRECISIONS)),
)

# The first-class factors of the selection rule's tie-break, in its order.
TIE_BREAK: tuple[Kind, ...] = tuple(sorted((k for k in FIRST_CLASS if k.tie_break is not None),
                                           key=lambda k: k.tie_break or 0))

# Titles of plain factors that have one (any other is titled by its key).
PLAIN_TITLES = {"train.lr": "Learning rate"}

_BY_NAME = {k.name: k for k in FIRST_CLASS}


def kind(name: str) -> Kind:
    """The registry entry of ``name``, or a plain factor's for any other (swept) param."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    return Kind(name=name, title=PLAIN_TITLES.get(name, name), params=(name,), axis=name)


def first_class(param: str) -> bool:
    """Whether ``param`` belongs to a first-class factor (so it is never a plain one)."""
    return any(k.owns(param) for k in FIRST_CLASS)


def title(name: str) -> str:
    """``Clipping``, ``Learning rate``; a plain factor without a title: its key."""
    return kind(name).title


def level_name(name: str, level: str) -> str:
    """``accum 8``, ``clip off``, ``max_norm 5``, ``bf16``, ``train.lr=0.01``."""
    return kind(name).name_of(level)


def sort_key(name: str, level: str) -> tuple:
    """How ``name``'s levels sort: the reference first."""
    return kind(name).order(level)


def simplicity(name: str, level: str, position: int) -> int:
    """0 for the simplest level: clip off, accum 1 (then smaller), fp32 before bf16 before fp16.

    No level of a plain factor (e.g. ``train.lr``) is simpler than another.
    """
    return kind(name).simplest(level, position)


def label_keys() -> tuple[str, ...]:
    """The params a config's label names: every first-class factor's ``keys``."""
    return tuple(p for k in FIRST_CLASS for p in k.keys)


def tie_break(params: Mapping[str, Params]) -> dict[str, tuple[int, ...]]:
    """Each config's simplicity per factor of the tie-break (``TIE_BREAK``'s order), 0 simplest.

    Args:
        params: each config's id and params (dotted keys); a level's position is its place
            among the levels these configs have (``order``), as in ``design.Design.of``.
    """
    simplest: dict[str, list[int]] = {c: [] for c in params}
    for k in TIE_BREAK:
        assert k.level is not None  # a first-class factor reads its level
        level = {c: k.level(p) for c, p in params.items()}
        ranked = sorted(set(level.values()), key=k.order)
        for c in params:
            simplest[c].append(k.simplest(level[c], ranked.index(level[c])))
    return {c: tuple(s) for c, s in simplest.items()}
