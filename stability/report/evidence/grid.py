"""The sweep's own grid, as its parent run recorded it: what may be a factor, which runs fit.

The sweep records every grid and command-line override on its parent run as a ``grid.<key>``
param (``sweep/parent.py``). A key whose value is a sweep (``a,b``, ``range(...)``,
``choice(...)``...) is swept; the report's factors are the swept keys only
(``stability.design.design.Design.of``), never every param that happens to vary: forty extra params
planted on two runs would otherwise be forty factors and a cube of 3^40 cells. A run whose
value of a setting the sweep did not sweep differs from the one the sweep's own runs share is
no point of the grid: it is set aside with one line. A setting that cannot matter for a run
(``core.identity.irrelevant``: ``clip.max_norm`` with clipping off, which the sweep drops from that
run's overrides, so it records the default) is neither compared for that run nor counted in
the shared value. A sweep without a recorded grid (no parent run) is read as before.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from stability.core.identity import irrelevant
from stability.design.design import NEVER, set_by
from stability.design.factors import CLIP_ENABLED, flag
from stability.report.evidence.inert import one_line

log = logging.getLogger(__name__)

GRID_PREFIX = "grid."
# Hydra's sweep forms besides a comma list (its override grammar's sweep functions)
SWEEP_FUNCTIONS = re.compile(r"^\s*(range|choice|glob|interval|tag|shuffle|sort)\s*\(")


def swept_keys(c: Any, parent_run_id: str | None) -> tuple[str, ...] | None:
    """The override keys the sweep swept; None when its parent recorded no grid."""
    if not parent_run_id:
        return None
    params = c.get_run(parent_run_id).data.params
    grid = {k.removeprefix(GRID_PREFIX): v for k, v in params.items()
            if k.startswith(GRID_PREFIX)}
    if not grid:
        return None
    return tuple(sorted(k for k, v in grid.items()
                        if "," in v or SWEEP_FUNCTIONS.match(v)))


def outside(runs: Sequence[Any], swept: Sequence[str],
            reference: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """``runs`` that are points of the grid, and one line per run set aside.

    Args:
        runs: the sweep's MLflow runs.
        swept: ``swept_keys``.
        reference: the runs whose shared values are the sweep's (its own, when recorded).
    """
    keys = {k for r in [*runs, *reference] for k in r.data.params
            if "." in k and not k.startswith(NEVER) and not set_by(k, swept)}
    shared = {}
    for k in keys:  # the value the runs it can matter for share
        values = Counter(r.data.params.get(k) for r in reference if k not in _inert(r))
        if values:
            shared[k] = values.most_common(1)[0][0]
    kept, lines = [], []
    for r in runs:
        odd = sorted(k for k in shared.keys() - _inert(r) if r.data.params.get(k) != shared[k])
        if not odd:
            kept.append(r)
            continue
        value = r.data.params.get(odd[0])
        more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
        lines.append(one_line(
            f"run {r.info.run_id} set aside: not a point of the sweep's grid: param "
            f"{odd[0][:80]}={'(absent)' if value is None else repr(value[:40])}{more} is not "
            f"swept and the sweep's runs have "
            f"{'(absent)' if shared[odd[0]] is None else repr(shared[odd[0]][:40])}"))
    for line in lines:
        log.warning("%s", line)
    return kept, lines


def _inert(run: Any) -> set[str]:
    """The settings that cannot matter for ``run`` (``core.identity.irrelevant`` of its params)."""
    params = run.data.params
    return irrelevant({**params, CLIP_ENABLED: flag(params.get(CLIP_ENABLED, False))})
