"""Read a sweep out of MLflow: run summaries in one paginated search, histories only on demand.

What each run carries is the contract in ``docs/TRACKING.md``. Summaries come from
``search_runs`` (1000 runs a page: the default ~240-run study is one request); per-epoch and
per-step histories are fetched only for what the report needs, in parallel.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from stability.core.config import ClipConfig, TrainConfig
from stability.core.task import DEFAULT_LOSS_NAME
from stability.core.validation import SAFE_NAME_ALLOWED, is_safe_name
from stability.report.evidence import adoption, grid, membership
from stability.report.evidence.inert import one_line
from stability.report.options import ReportError
from stability.tracking import children, origins
from stability.tracking.contract import Artifact, Kind, Outcome, Tag, search_filter
from stability.tracking.queries import search_all

log = logging.getLogger(__name__)

T = TypeVar("T")


def _flag(text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"{text!r} is not true | false")
    return value == "true"


def _positive_float(text: str) -> float:
    value = float(text)  # 'abc' raises; 'inf' and 'nan' parse and are refused below
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{text!r} is not a finite number > 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} is not an integer >= 1")
    return value


# Param columns the report computes with, and their types (MLflow stores params as strings);
# each takes what the run's own config would (core/config.py), so a value no run could have
# trained with marks its run unreadable. Every other param stays the string it is: a label
# or a factor level, never a number the report computes with.
TYPED_PARAMS: dict[str, Callable[[str], Any]] = {
    "clip.enabled": _flag,
    "clip.max_norm": _positive_float,
    "clip.clip_value": _positive_float,
    "train.accum_steps": _positive_int,
    "train.epochs": _positive_int,
    "train.lr": _positive_float,
}


@dataclass(frozen=True)
class Sweep:
    """The sweep a report is about."""

    experiment: str
    experiment_id: str
    sweep_id: str
    parent_run_id: str | None  # the sweep's parent run (None if the sweeper logged none)


NEWEST_FIRST = ["attributes.start_time DESC"]
UNREADABLE = "unreadable"  # the outcome of a run whose tags or params do not parse


def _known_sweeps(c: Any, exp_id: str, limit: int = 10) -> list[str]:
    parents = search_all(c, exp_id, search_filter(Kind.SWEEP), NEWEST_FIRST, limit)
    return [r.data.tags.get(Tag.SWEEP_ID, "") for r in parents]


def find_sweep(c: Any, experiment: str, sweep_id: str | None) -> Sweep:
    """Resolve the experiment and the sweep (the latest one when ``sweep_id`` is None).

    Raises:
        ReportError: the experiment does not exist, holds no sweep, or has no such sweep id,
            or it keeps its artifacts outside the configured store (``origins``).
    """
    exp = c.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage == "deleted":
        names = sorted(e.name for e in c.search_experiments(max_results=50))
        raise ReportError(
            f"experiment={experiment!r} is invalid: no such experiment at this tracking URI; "
            f"allowed values are the existing experiments: {', '.join(names) or '(none)'}"
        )
    try:  # every run of it keeps its artifacts there: MLflow would send credentials there
        origins.check(c.tracking_uri, exp.artifact_location, f"experiment {experiment!r}")
    except origins.ForeignArtifacts as err:
        raise ReportError(str(err)) from None
    exp_id = exp.experiment_id
    known = _known_sweeps(c, exp_id)
    if sweep_id is None:
        if known:
            sweep_id = known[0]
        else:  # no parent run: fall back to the newest training run that belongs to a sweep
            latest = search_all(c, exp_id, search_filter(Kind.TRAIN) +
                                f" and tags.`{Tag.SWEEP_ID}` != ''", NEWEST_FIRST, 1)
            if not latest:
                raise ReportError(
                    f"experiment={experiment!r} has no sweeps (no run tagged "
                    "stability.kind=sweep or a training run with a stability.sweep_id): run "
                    "`python experiments/sweep.py -m` first, or choose another experiment=..."
                )
            sweep_id = latest[0].data.tags[Tag.SWEEP_ID]
    if not is_safe_name(sweep_id):  # read from a tag: data, never a path or a filter as is
        raise ReportError(f"the latest sweep of experiment={experiment!r} has the sweep id "
                          f"{sweep_id!r}, which is invalid: allowed values are "
                          f"{SAFE_NAME_ALLOWED}; choose a sweep with sweep_id=...")
    parents = search_all(c, exp_id, search_filter(Kind.SWEEP, sweep_id), ["attributes.start_time"],
                         MAX_PARENTS_SHOWN)
    if len(parents) > 1:  # a teammate's run tagged with the id: no rule of ours picks one
        raise ReportError(_one_line(
            f"sweep_id={sweep_id!r} is ambiguous: experiment {experiment!r} holds "
            f"{'at least ' if len(parents) == MAX_PARENTS_SHOWN else ''}{len(parents)} parent "
            f"runs of it ({', '.join(_parent(r) for r in parents)}), and a sweep creates one: "
            "someone else created the others; refused, nothing reported (ask them, or delete "
            "the run that is not yours)"))
    return Sweep(experiment, exp_id, sweep_id, parents[0].info.run_id if parents else None)


MAX_PARENTS_SHOWN = 5  # parent runs of one sweep id named in the refusal


def _parent(run: Any) -> str:
    return f"{run.info.run_id} created by {adoption.user_of(run) or 'no user'}"


_one_line = one_line


def _typed(key: str, value: str) -> Any:
    try:
        return TYPED_PARAMS[key](value)
    except (TypeError, ValueError, OverflowError) as err:  # the param's name, for the line
        raise ValueError(f"param {key}={value[:80]!r} is invalid ({err})") from None


def outcome_of(tag: str | None, status: str) -> str:
    """A run's outcome: its ``stability.outcome`` tag only where MLflow's status agrees.

    The tag is data anyone can write: a KILLED run tagged ``finished`` is killed, and only a
    FINISHED run (whose artifacts are then checked, ``adoption.unbacked``) is finished. A run
    closed without its final tag, or with a tag that is no outcome, takes its status's.
    """
    try:
        claimed = Outcome(tag) if tag else None
    except ValueError:
        claimed = None
    if claimed is None or claimed.status != ("RUNNING" if status == "SCHEDULED" else status):
        return str(Outcome.from_status(status))
    return str(claimed)


def _row(run: Any) -> dict[str, Any]:
    tags, params = run.data.tags, run.data.params
    outcome = outcome_of(tags.get(Tag.OUTCOME), run.info.status)
    row: dict[str, Any] = {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "start_time": run.info.start_time,
        "artifact_uri": run.info.artifact_uri,
        "fingerprint": tags.get(Tag.FINGERPRINT, ""),
        "seed": -1,
        "outcome": str(outcome),
        "reason": tags.get(Tag.REASON, ""),
        "loss_name": tags.get(Tag.LOSS_NAME, ""),
        "user": adoption.user_of(run),  # who created it (the report names other users' runs)
    }
    row.update(run.data.metrics)
    # Text read from runs is data: control characters (newlines) would restructure the
    # markdown report, and a backtick or ``](`` would make markup of it, so every string is
    # kept to one inert line here, at the way in (``inert.inert``).
    row = {k: _one_line(v) if isinstance(v, str) else v for k, v in row.items()}
    params = {k: _one_line(v) for k, v in params.items()}
    tags = {k: _one_line(v) for k, v in tags.items()}
    # Tags and params are data a teammate wrote: a bad one marks this run, not the report.
    # Every key is still filled (a value that does not parse: its neutral default, replaced
    # by a readable run's of the same config in ``fetch_runs``), so no table meets a hole.
    errors: list[str] = []
    row["seed"] = _parsed(errors, -1, _seed, tags.get(Tag.SEED, params.get("seed", -1)))
    for key, value in params.items():
        if key != "seed":
            row[key] = _parsed(errors, _neutral().get(key), _typed, key, value) \
                if key in TYPED_PARAMS else value
    if errors:
        log.warning("run %s is unreadable: %s", run.info.run_id, errors[0])
        row |= {"outcome": UNREADABLE, "reason": f"unreadable run: {errors[0]}"[:300]}
    return row


def _seed(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"seed {str(value)[:80]!r} is invalid ({err})") from None


def _parsed(errors: list[str], default: Any, parse: Callable[..., T], *args: Any) -> T | Any:
    try:
        return parse(*args)
    except (TypeError, ValueError, OverflowError) as err:
        errors.append(str(err))
        return default


@functools.cache
def _neutral() -> dict[str, Any]:
    """The default config's typed params: what an unreadable value is read as (the sections'
    field defaults, read without building a config: that would import its optimizer)."""
    defaults = {f"{section}.{f.name}": f.default for section, cls in
                (("clip", ClipConfig), ("train", TrainConfig)) for f in dataclasses.fields(cls)}
    return {k: defaults[k] for k in TYPED_PARAMS}


def _settle(df: pd.DataFrame) -> pd.DataFrame:
    """An unreadable run takes its typed params from a readable run of its config, if any
    (one fingerprint is one config): the config keeps its own label and levels."""
    keys = [k for k in TYPED_PARAMS if k in df.columns]
    bad = df["outcome"] == UNREADABLE
    if not bad.any() or not keys:
        return df
    good = df[~bad].drop_duplicates("fingerprint").set_index("fingerprint")[keys]
    for i in df.index[bad & df["fingerprint"].isin(good.index)]:
        df.loc[i, keys] = good.loc[df.at[i, "fingerprint"]].to_numpy()
    return df


RUN_ID = re.compile(r"[0-9a-f]{32}")  # an MLflow run id (uuid4 hex)
MAX_ADOPTED = 100_000  # run ids a sweep may adopt (the default study has ~240 runs)
MAX_ADOPTED_BYTES = 64 * MAX_ADOPTED  # the artifact's size: '"<32 hex>", ' per id, and slack
ID_CHUNK = 100  # run ids per search request


def adopted_ids(c: Any, sweep: Sweep) -> list[str]:
    """The run ids the sweep's parent names in ``Artifact.ADOPTED_RUNS`` (a resumed sweep).

    The artifact is data: only a JSON list of run ids (32 lowercase hex characters, at most
    ``MAX_ADOPTED``) is used; anything else is ignored with a warning. No artifact: none.
    """
    if sweep.parent_run_id is None:
        return []
    try:
        uri = origins.run_uri(c, sweep.parent_run_id)
        info = {f.path: f for f in origins.listing(c, sweep.parent_run_id, artifact_uri=uri)}
        entry = info.get(Artifact.ADOPTED_RUNS)
        if entry is None:
            return []  # a sweep that skipped nothing
        if entry.is_dir or (entry.file_size or 0) > MAX_ADOPTED_BYTES:
            raise ValueError(f"not a file of at most {MAX_ADOPTED_BYTES} bytes")
        with tempfile.TemporaryDirectory() as tmp:
            path = origins.download(c, sweep.parent_run_id, Artifact.ADOPTED_RUNS, tmp, uri)
            ids = json.loads(path.read_text(encoding="utf-8")[:MAX_ADOPTED_BYTES])
        if not isinstance(ids, list) or len(ids) > MAX_ADOPTED:
            raise ValueError(f"not a list of at most {MAX_ADOPTED} run ids")
    except Exception as err:  # written by a teammate's sweep: the report stands without it
        log.warning("sweep %s: %s ignored (%s)", sweep.sweep_id, Artifact.ADOPTED_RUNS,
                    _one_line(str(err))[:200])
        return []
    good = [i for i in ids if isinstance(i, str) and RUN_ID.fullmatch(i)]
    if len(good) < len(ids):
        log.warning("sweep %s: %d invalid run ids in %s ignored", sweep.sweep_id,
                    len(ids) - len(good), Artifact.ADOPTED_RUNS)
    return list(dict.fromkeys(good))


def adopted_runs(c: Any, sweep: Sweep) -> list[Any]:
    """The training runs of the sweep's experiment that the sweep adopted (``adopted_ids``).

    Searched by id within the experiment and kind: an id naming a run of another experiment,
    or no training run, finds nothing (validated ids only ever enter the filter).
    """
    ids = adopted_ids(c, sweep)
    runs: list[Any] = []
    for i in range(0, len(ids), ID_CHUNK):
        chunk = ", ".join(f"'{r}'" for r in ids[i : i + ID_CHUNK])
        runs += search_all(c, sweep.experiment_id,
                           f"{search_filter(Kind.TRAIN)} and attributes.run_id IN ({chunk})")
    if len(runs) < len(ids):
        log.warning("sweep %s: %d adopted runs are not training runs of experiment %r",
                    sweep.sweep_id, len(ids) - len(runs), sweep.experiment)
    return runs


def fetch_runs(c: Any, sweep: Sweep, allowed: Sequence[str] | None = None,
               workers: int = 8, set_aside: list[str] | None = None) -> pd.DataFrame:
    """Every training run of the sweep, one row each: tags, typed params, summary metrics.

    The sweep's runs are those tagged with its id plus those it adopted (a resumed sweep
    skipped their points as already FINISHED: ``adopted_runs``). Given ``allowed`` (the task
    import paths a config may name), a FINISHED run whose artifacts do not back it is
    unreadable, with the reason (``adoption.unbacked``). A (config, seed) point logged more
    than once keeps its finished run, else its newest one. Runs the sweep's own record does
    not vouch for (``membership.own_runs``) are left out, one line each into ``set_aside``.

    Raises:
        ReportError: the sweep has no training runs.
    """
    runs = search_all(c, sweep.experiment_id, search_filter(Kind.TRAIN, sweep.sweep_id))
    own = {r.info.run_id for r in runs}
    adopted = [r for r in adopted_runs(c, sweep) if r.info.run_id not in own]
    try:
        runs, lines = membership.own_runs(c, sweep.parent_run_id, runs + adopted,
                                          [r.info.run_id for r in adopted])
    except (children.RecordMissing, origins.ForeignArtifacts) as err:
        raise ReportError(f"sweep_id={sweep.sweep_id!r}: {err}") from None
    swept = _swept(c, sweep)
    if swept is not None:  # a run that is no point of the sweep's own grid is set aside
        runs, outside = grid.outside(runs, swept, runs)
        lines += outside
    if set_aside is not None:
        set_aside += lines
    if not runs:
        known = _known_sweeps(c, sweep.experiment_id)
        raise ReportError(
            f"sweep_id={sweep.sweep_id!r} is invalid: experiment {sweep.experiment!r} has no "
            f"training runs with that sweep id; allowed values are its sweeps (latest first): "
            f"{', '.join(known) or '(none)'}"
        )
    bad = [r.info.run_id for r in runs if not is_safe_name(r.info.run_id)]
    if bad:  # run ids become folder names of the downloads
        log.warning("runs with invalid ids left out: %s", ", ".join(map(repr, bad[:5])))
    runs = [r for r in runs if is_safe_name(r.info.run_id)]
    foreign = adoption.foreign(c, runs)  # nothing of theirs is read: one bad run each
    ours = [r for r in runs if r.info.run_id not in foreign]
    unbacked = foreign | (adoption.unbacked(c, ours, allowed, workers) if allowed is not None
                          else {})
    df = pd.DataFrame([_row(r) for r in runs])
    for key in (k for k in TYPED_PARAMS if k in df.columns):  # absent: as one that does not parse
        for i in df.index[df[key].isna()]:
            unbacked.setdefault(df.at[i, "run_id"], f"param {key} is missing")
            df.at[i, key] = _neutral()[key]
    for i in df.index[df["run_id"].isin(list(unbacked))]:
        why = one_line(unbacked[df.at[i, "run_id"]])
        log.warning("run %s is unreadable: %s", df.at[i, "run_id"], why)
        df.loc[i, ["outcome", "reason"]] = [UNREADABLE, f"unreadable run: {why}"[:300]]
    df["_finished"] = df["outcome"] == "finished"
    df = df.sort_values(["_finished", "start_time"], ascending=False)
    dropped = df.duplicated(["fingerprint", "seed"]).sum()
    if dropped:
        log.warning("%d superseded runs of a repeated (config, seed) point ignored", dropped)
    df = _settle(df.drop_duplicates(["fingerprint", "seed"]).drop(columns="_finished"))
    df = df.sort_values(["fingerprint", "seed"]).reset_index(drop=True)
    df.attrs[SWEPT] = swept  # the factors are the sweep's swept keys (factors.design)
    return df


SWEPT = "swept"  # DataFrame.attrs key of fetch_runs: the sweep's swept keys (None: unknown)


def _swept(c: Any, sweep: Sweep) -> tuple[str, ...] | None:
    try:
        return grid.swept_keys(c, sweep.parent_run_id)
    except Exception as err:  # the parent cannot be read: the runs' params decide, as before
        log.warning("sweep %s: its grid cannot be read (%s)", sweep.sweep_id,
                    _one_line(str(err))[:200])
        return None


def loss_name(runs: pd.DataFrame) -> str:
    """What the sweep's loss is (``stability.loss_name`` of its runs), for axes and tables.

    Runs recorded before the tag existed say nothing: the neutral ``"loss"``.
    """
    names = sorted({n for n in runs.get("loss_name", pd.Series(dtype=str)).dropna() if n})
    return " / ".join(names) or DEFAULT_LOSS_NAME


def parallel(fn: Callable[[str], T], keys: Iterable[str], workers: int) -> dict[str, T]:
    """``{key: fn(key)}`` with ``workers`` threads (requests to MLflow are I/O bound)."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return {}
    with ThreadPoolExecutor(max_workers=min(workers, len(keys))) as pool:
        return dict(zip(keys, pool.map(fn, keys), strict=True))


def metric_histories(c: Any, run_ids: Iterable[str], key: str,
                     workers: int = 8) -> dict[str, pd.Series]:
    """``{run_id: Series(value, index=step)}`` of one metric's full history per run."""

    def one(run_id: str) -> pd.Series:
        points = c.get_metric_history(run_id, key)
        s = pd.Series({m.step: m.value for m in points}, dtype=float, name=key)
        return s.sort_index()

    return parallel(one, run_ids, workers)


def val_acc_at_best(c: Any, runs: pd.DataFrame, workers: int = 8) -> pd.Series:
    """Validation accuracy at each run's best epoch (NaN where the run has none).

    Uses a ``best_val_acc`` summary metric when runs carry one; else the latest ``val_acc``
    when the best epoch is the last epoch; else the ``val_acc`` history (fetched in parallel).
    """
    out = pd.Series(math.nan, index=runs.index, dtype=float)
    if "best_epoch" not in runs:  # a hand-tracked run needs only best_val_loss (Rebuild)
        return out
    best = pd.to_numeric(runs["best_epoch"], errors="coerce")
    logged = runs.get("best_val_acc")
    if logged is not None:
        out[logged.notna()] = logged[logged.notna()]
    epochs = runs.get("train.epochs")
    latest = runs.get("val_acc")
    need: dict[str, tuple[Any, int]] = {}
    for i, row in runs.iterrows():
        if not math.isnan(out[i]) or not (best[i] >= 1):
            continue
        if latest is not None and epochs is not None and row["outcome"] == "finished" \
                and best[i] == epochs[i] and not pd.isna(latest[i]):
            out[i] = latest[i]
        else:
            need[row["run_id"]] = (i, int(best[i]))
    histories = metric_histories(c, need, "val_acc", workers)
    for run_id, (i, epoch) in need.items():
        out[i] = histories[run_id].get(epoch, math.nan)
    return out


def download(c: Any, run_id: str, path: str, dest: Path,
             artifact_uri: str | None = None) -> Path | None:
    """Download one artifact of a run into ``dest``; ``None`` (with a warning) if it is absent
    or the run keeps its artifacts outside the configured store (``origins``).

    Given the run's ``artifact_uri`` (every fetched run row has it), the file is read from there:
    2 requests to a tracking server instead of the 6 of ``MlflowClient.download_artifacts``
    (which looks the run up twice, lists the folder, asks for the server's info and searches
    logged models), the report's largest request count on a big sweep (one file a run).
    """
    dest.mkdir(parents=True, exist_ok=True)
    try:
        return origins.download(c, run_id, path, dest,
                                artifact_uri if isinstance(artifact_uri, str) else "")
    except Exception as err:  # a missing artifact must not end the report
        log.warning("run %s has no artifact %s (%s)", run_id, path, one_line(str(err))[:300])
        return None
