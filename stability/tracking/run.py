"""MLflow tracking: URI resolution, run lifecycle, a buffered metric sink, params/tags/artifacts.

The training loop never waits on the network: per-step metrics are buffered in process and
sent with ``log_batch`` (<= 1000 metrics a call) from one background thread, in full batches
or at an epoch end at least ``FLUSH_EVERY_S`` after the previous send, and at run end; the
run's CSV stays the ground truth if the process dies before a flush. What each run records
is the contract in ``docs/TRACKING.md``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stability.core.config import ConfigError, RunConfig, fingerprint, flatten
from stability.core.signals import Terminated, sigterm_as_exception
from stability.core.steplog import EpochLog, StepLog

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # stability/ (in a checkout: its repo)
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # log_batch limits per call
# On the embedded SQLite store a log_batch costs ~150-250 us of CPU a metric in batches of 78
# (one epoch of a default run) but ~80 us in batches of 1000 (ORM and commit per call): sent
# per epoch, tracking took ~15-20% of a default run's training CPU. Full batches, and at most
# one partial send per FLUSH_EVERY_S, halve that while the UI stays at most this far behind.
FLUSH_EVERY_S = 10.0
REACH_TIMEOUT_S = 5.0
STEP_METRICS = ("loss", "lr", "grad_norm_pre_clip", "grad_norm_post_clip", "clipped", "skipped",
                "scaler_scale", "skips_cumulative")
OUTCOME_STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED",
                  "killed": "KILLED"}

# Fail fast instead of MLflow's default of 7 retries with back-off (minutes against a dead server).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


class TrackingError(RuntimeError):
    """The tracking server cannot be used (unreachable, refused)."""


def default_store_uri() -> str:
    """The embedded default: ``./mlflow.db`` of the current directory (MLflow's own convention).

    Resolved to an absolute path once, so every job of a sweep (each in its own Hydra output
    folder) writes to the same file. Not the deprecated file store.
    """
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """``tracking.uri`` if given, else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite store."""
    resolved = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_store_uri()
    validate_uri(resolved)
    return resolved


def check_reachable(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``TrackingError`` within ``timeout_s`` if an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as r:
            if r.status == 200:
                return
            raise TrackingError(f"tracking server {uri} answered /health with HTTP {r.status}")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"tracking server {uri} is not reachable ({reason}); start it (see "
            "docs/team-server.md) or set tracking.uri / MLFLOW_TRACKING_URI to a running server"
        ) from None


def client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (imported lazily: importing MLflow costs ~1 s)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_experiment(uri: str, name: str) -> str:
    """Create the store (and its schema) and the experiment if needed; returns its id.

    Call this once before parallel jobs start: two processes initialising a brand-new SQLite
    store at once crash MLflow's migrations.
    """
    check_reachable(uri)
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp else c.create_experiment(name, local_artifact_root(uri, name))


def local_artifact_root(uri: str, experiment: str) -> str | None:
    """Where a new experiment of a SQLite store keeps artifacts: ``mlruns/`` beside the file.

    MLflow's default is ``./mlruns`` of whatever directory the first run started in, which
    scatters artifacts (and mixes experiment ids of different stores). Servers decide for
    themselves: None.
    """
    if not uri.startswith("sqlite:///"):
        return None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)
    return str(Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlruns" / slug)


@functools.cache
def git_commit() -> str:
    """The commit of the code that runs: this package's checkout, else the current folder's.

    An installed (non-editable) package has no checkout; a user's own task then lives in
    the current folder's repository, if any. "" when neither is a git checkout.
    """
    for where in (PACKAGE_DIR, Path.cwd()):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return ""


def run_name(cfg: RunConfig) -> str:
    """A name a person can read, e.g. ``fp16 clip=1.0 acc=4 s=3``."""
    if not cfg.clip.enabled:
        clip = "noclip"
    elif cfg.clip.method == "norm":
        clip = f"clip={cfg.clip.max_norm:g}"
    else:
        clip = f"clipv={cfg.clip.clip_value:g}"
    return f"{cfg.precision.name} {clip} acc={cfg.train.accum_steps} s={cfg.seed}"


def _metric(key: str, value: float, step: int, ts: int) -> Any:
    from mlflow.entities import Metric

    return Metric(key, float(value), ts, step)


class MetricBuffer:
    """Step sink that buffers metrics and ships them with ``log_batch`` off the training thread.

    The training thread only appends plain tuples (~2 us a step); the background thread builds
    the ``Metric`` objects and sends them when ``MAX_METRICS`` are pending, at the first epoch
    end, at a later epoch end once ``flush_every_s`` has passed since the last send, and on
    ``close``.
    """

    def __init__(self, mlflow_client: Any, run_id: str,
                 flush_every_s: float = FLUSH_EVERY_S) -> None:
        self._client = mlflow_client
        self._run_id = run_id
        self._pending: list[tuple[str, float, int, int]] = []
        self._skips = 0
        self._flush_every_s = flush_every_s
        self._last_flush = -math.inf  # the first epoch goes out at once: a new run shows curves
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-flush")
        self._futures: list[Future] = []

    def on_step(self, s: StepLog, epoch: int) -> None:
        """Buffer the step's metrics (no I/O on this thread)."""
        self._skips += s.skipped
        ts = int(time.time() * 1000)
        values = (s.loss, s.lr, s.grad_l2_pre_clip, s.grad_l2_post_clip, float(s.clipped),
                  float(s.skipped), s.scaler_scale, float(self._skips))
        self._pending.extend((k, v, s.step, ts) for k, v in zip(STEP_METRICS, values,
                                                                 strict=True))
        if len(self._pending) >= MAX_METRICS:
            self.flush(wait=False)

    def on_epoch(self, e: EpochLog) -> None:
        """Buffer the epoch's metrics; send in the background if ``flush_every_s`` has passed."""
        ts = int(time.time() * 1000)
        for key, value in (("train_loss", e.train_loss), ("val_loss", e.val_loss),
                           ("val_acc", e.val_acc), ("epoch_clip_fraction", e.clip_fraction),
                           ("max_grad_norm", e.max_grad_norm),
                           ("epoch_skip_count", e.skip_count)):
            self._pending.append((key, value, e.epoch, ts))
        if (len(self._pending) >= MAX_METRICS
                or time.monotonic() - self._last_flush >= self._flush_every_s):
            self.flush(wait=False)

    def add(self, metrics: dict[str, float], step: int = 0) -> None:
        """Buffer arbitrary metrics (summary values)."""
        ts = int(time.time() * 1000)
        self._pending.extend((k, v, step, ts) for k, v in metrics.items())

    def _send(self, batch: list[tuple[str, float, int, int]]) -> None:
        for i in range(0, len(batch), MAX_METRICS):
            metrics = [_metric(*m) for m in batch[i : i + MAX_METRICS]]
            self._client.log_batch(self._run_id, metrics=metrics, synchronous=True)

    def flush(self, wait: bool = True) -> None:
        """Send what is buffered; with ``wait`` block until every send has finished."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._futures.append(self._pool.submit(self._send, batch))
            self._last_flush = time.monotonic()
        if wait:
            futures, self._futures = self._futures, []
            for f in futures:
                f.result()

    def close(self) -> None:
        """Flush and stop the background thread."""
        try:
            self.flush(wait=True)
        finally:
            self._pool.shutdown(wait=True)


def _log_params(c: Any, run_id: str, cfg: RunConfig) -> None:
    from mlflow.entities import Param

    params = [Param(k, str(v)) for k, v in flatten(cfg).items() if k != "output_dir"]
    for i in range(0, len(params), MAX_PARAMS):
        c.log_batch(run_id, params=params[i : i + MAX_PARAMS], synchronous=True)


def _summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float)}


class TrackedRun:
    """One MLflow run around one training run: create, params, buffered metrics, close.

    Use as a context manager; ``sink`` goes to ``run.train``. Leaving the block with an
    exception ends the run FAILED (or KILLED on Ctrl-C / SIGTERM) with a reason tag, after
    uploading what exists (the CSV is complete up to the last step).
    """

    def __init__(self, cfg: RunConfig, overrides: Sequence[str] = (), world_size: int = 1) -> None:
        self.cfg = cfg
        self.world_size = world_size
        self.uri = resolve_tracking_uri(cfg.tracking.uri)
        self.overrides = [o for o in overrides if not o.startswith("tracking.")]
        self.run_id = ""
        self.outcome = ""
        self._client: Any = None
        self.sink: MetricBuffer | None = None

    def __enter__(self) -> TrackedRun:
        check_reachable(self.uri)
        self._client = client(self.uri)
        exp = self._client.get_experiment_by_name(self.cfg.tracking.experiment)
        exp_id = exp.experiment_id if exp else ensure_experiment(self.uri,
                                                                 self.cfg.tracking.experiment)
        t = self.cfg.tracking
        tags = {
            "stability.kind": "train",
            "stability.sweep_id": t.sweep_id or "",
            "stability.fingerprint": fingerprint(self.cfg, self.world_size),
            "stability.seed": str(self.cfg.seed),
            "stability.overrides": " ".join(self.overrides),
            "stability.git_commit": git_commit(),
            "stability.outcome": "running",
        }
        if t.parent_run_id:
            tags["mlflow.parentRunId"] = t.parent_run_id
        run = self._client.create_run(exp_id, tags=tags, run_name=run_name(self.cfg))
        self.run_id = run.info.run_id
        _log_params(self._client, self.run_id, self.cfg)
        self.sink = MetricBuffer(self._client, self.run_id)
        self._signals = sigterm_as_exception()
        self._signals.__enter__()
        return self

    def finish(self, summary: dict[str, Any], outcome: str, reason: str = "") -> None:
        """Record the summary metrics and the outcome (``finished`` or ``diverged``)."""
        assert self.sink is not None
        self.sink.add(_summary_metrics(summary))
        for key, value in summary.items():
            if isinstance(value, str) and value:
                self._client.set_tag(self.run_id, f"stability.{key}", value)
        self.outcome, self.reason = outcome, reason

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._signals.__exit__(None, None, None)
        if exc is not None:
            killed = isinstance(exc, KeyboardInterrupt | Terminated)
            self.outcome = "killed" if killed else "failed"
            self.reason = f"{type(exc).__name__}: {exc}"[:5000]
        outcome = self.outcome or "failed"
        try:
            if self.sink is not None:
                self.sink.close()
            self._upload_artifacts()
            self._client.set_tag(self.run_id, "stability.outcome", outcome)
            if getattr(self, "reason", ""):
                self._client.set_tag(self.run_id, "stability.reason", self.reason[:5000])
        finally:
            self._client.set_terminated(self.run_id, status=OUTCOME_STATUS[outcome])
        return False

    def _upload_artifacts(self) -> None:
        from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME

        out = Path(self.cfg.output_dir)
        for name in (CSV_NAME, CONFIG_NAME, CHECKPOINT_NAME):
            path = out / name
            if path.exists():
                parent = str(Path(name).parent) if "/" in name else None
                self._client.log_artifact(self.run_id, str(path), artifact_path=parent)


def finished_points(uri: str, experiment: str) -> set[tuple[str, int]]:
    """``(fingerprint, seed)`` of every FINISHED training run in ``experiment``."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return set()
    done: set[tuple[str, int]] = set()
    token = None
    while True:
        page = c.search_runs([exp.experiment_id],
                             filter_string="attributes.status = 'FINISHED' and "
                                           "tags.`stability.kind` = 'train'",
                             max_results=1000, page_token=token)
        for r in page:
            fp, seed = r.data.tags.get("stability.fingerprint"), r.data.tags.get("stability.seed")
            if fp and seed is not None:
                done.add((fp, int(seed)))
        token = page.token
        if not token:
            return done


def validate_uri(uri: str) -> None:
    """Reject URIs MLflow 3 would refuse or silently misuse (e.g. the deprecated file store)."""
    if uri.startswith("file:") or "://" not in uri:
        raise ConfigError(
            f"tracking.uri={uri!r} is invalid: allowed values are http(s)://host:port, "
            "sqlite:///path/to/mlflow.db, postgresql://..., or null for the embedded store"
        )
