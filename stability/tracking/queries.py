"""Reading runs back: the one paged ``search_runs`` loop and the questions built on it."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from stability.tracking.contract import Kind, Tag, search_filter
from stability.tracking.uri import client

log = logging.getLogger(__name__)

PAGE = 1000  # search_runs' maximum page size


def search_all(c: Any, experiment_ids: str | Iterable[str], filter_string: str = "",
               order_by: list[str] | None = None, limit: int | None = None) -> list[Any]:
    """Every run matching ``filter_string`` (paged, ``PAGE`` runs a request), up to ``limit``.

    Args:
        c: an ``MlflowClient``.
        experiment_ids: one experiment id or several.
        filter_string: an MLflow filter (``contract.search_filter`` builds ours).
        order_by: MLflow ``order_by`` clauses.
        limit: stop after this many runs (None: all).
    """
    ids = [experiment_ids] if isinstance(experiment_ids, str) else list(experiment_ids)
    runs: list[Any] = []
    token = None
    while True:
        page = c.search_runs(ids, filter_string=filter_string, order_by=order_by,
                             max_results=min(PAGE, limit or PAGE), page_token=token)
        runs.extend(page)
        token = page.token
        if not token or (limit is not None and len(runs) >= limit):
            return runs[:limit] if limit is not None else runs


def point_of(run: Any) -> tuple[str, int] | None:
    """``(fingerprint, seed)`` of a training run (None if it lacks the tags, or its seed tag
    is not a plain integer: a tag is data, one bad run must not stop a sweep)."""
    tags = run.data.tags
    fp, seed = tags.get(Tag.FINGERPRINT), tags.get(Tag.SEED)
    if not fp or seed is None:
        return None
    text = str(seed).strip()
    if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit() and len(text) <= 20):
        log.warning("run %s: its %s tag %r is not an integer: not a point of any sweep",
                    run.info.run_id, Tag.SEED, text[:40])
        return None
    return fp, int(text)


def finished_runs(uri: str, experiment: str) -> list[Any]:
    """Every FINISHED training run in ``experiment`` (none if it does not exist)."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return search_all(c, exp.experiment_id, search_filter(Kind.TRAIN, status="FINISHED"))


def points_of(runs: Iterable[Any]) -> set[tuple[str, int]]:
    """``(fingerprint, seed)`` of ``runs`` (those with the tags)."""
    return {p for p in map(point_of, runs) if p is not None}


def finished_points(uri: str, experiment: str) -> set[tuple[str, int]]:
    """``(fingerprint, seed)`` of every FINISHED training run in ``experiment``."""
    return points_of(finished_runs(uri, experiment))


def metric_steps(c: Any, run_id: str, keys: Iterable[str]) -> dict[str, set[int]]:
    """``{metric: steps MLflow holds}`` for ``keys`` of one run (a sync sends only the rest)."""
    return {k: {m.step for m in c.get_metric_history(run_id, k)} for k in keys}
