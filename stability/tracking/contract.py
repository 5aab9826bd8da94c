"""Every name this project writes into (or reads from) MLflow, in one place.

``docs/TRACKING.md`` documents the same names; a test checks that every tag, metric and
artifact name defined here appears there. Per-step metrics carry the name of their
``steps.csv`` column, so one word means one quantity everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from stability.core import rundir
from stability.core.cost import COST_METRICS
from stability.core.steplog import STEP_METRICS, SkipReason
from stability.core.validation import safe_name

__all__ = ["COST_METRICS", "LOSS_INIT", "RUN_METRICS", "STEP_METRICS", "EPOCH_METRICS",
           "SCHEDULER_STEPPED", "SCHEDULER_STEPS_ON_SKIP", "TRAINER_PARAM", "Artifact", "Kind",
           "Outcome", "Rebuild", "SkipReason", "Tag", "missing_records", "search_filter"]


class Kind(StrEnum):
    """``stability.kind`` of a run: what sort of run it is."""

    TRAIN = "train"  # one (config, seed) point
    SWEEP = "sweep"  # a sweep's parent run; training runs nest under it
    REPORT = "report"  # the review report of one sweep
    CHECK = "check"  # one ``stability check`` of a task's training mechanics


class Outcome(StrEnum):
    """``stability.outcome``: how a run ended, finer than MLflow's status."""

    RUNNING = "running"
    FINISHED = "finished"
    DIVERGED = "diverged"  # the skip-rate monitor ended it
    FAILED = "failed"  # an exception
    KILLED = "killed"  # Ctrl-C, SIGTERM, scancel, or its process vanished

    @property
    def status(self) -> str:
        """The MLflow run status this outcome ends with."""
        return _STATUS[self]

    @classmethod
    def from_status(cls, status: str) -> Outcome:
        """The outcome of a run that was closed without its outcome tag."""
        return {"FINISHED": cls.FINISHED, "KILLED": cls.KILLED, "RUNNING": cls.RUNNING,
                "SCHEDULED": cls.RUNNING}.get(status, cls.FAILED)


_STATUS = {Outcome.RUNNING: "RUNNING", Outcome.FINISHED: "FINISHED", Outcome.DIVERGED: "FAILED",
           Outcome.FAILED: "FAILED", Outcome.KILLED: "KILLED"}


class Tag:
    """Tag keys (``stability.*`` plus the MLflow system tags we set)."""

    KIND = "stability.kind"
    SWEEP_ID = "stability.sweep_id"
    FINGERPRINT = "stability.fingerprint"
    SEED = "stability.seed"
    OVERRIDES = "stability.overrides"
    GIT_COMMIT = "stability.git_commit"
    OUTCOME = "stability.outcome"
    REASON = "stability.reason"
    GRID_SIZE = "stability.grid_size"
    GRID_UNIQUE = "stability.grid_unique"
    SWEEP_RUN_ID = "stability.sweep_run_id"
    # The decision's config ("chosen"; a store written before issue 59 has ``RENAMED``'s old
    # names, which a reader takes too: ``read_tag``)
    WINNER = "stability.chosen"
    WINNER_LABEL = "stability.chosen_label"
    SELECTION_RULE = "stability.selection_rule"
    PARENT_RUN_ID = "mlflow.parentRunId"  # nests a training run under its sweep in the UI
    NOTE = "mlflow.note.content"  # a run's description, rendered as markdown on its UI page
    REPORT_RUN_ID = "stability.report_run_id"  # on the sweep's parent: its latest report run
    WINNER_STABILITY = "stability.chosen_stability"  # stable | marginal | unstable
    MAX_NORM_RECOMMENDATION = "stability.max_norm_recommendation"  # per accum, from clip-off runs
    MODEL_URI = "stability.model_uri"  # models:/<name>@champion of the registered winner
    HEARTBEAT = "stability.heartbeat"  # ms since the epoch, refreshed by the run's sender thread
    PROCESS = "stability.process"  # "<host>:<pid>" of the process that trains the run
    OUTPUT_DIR = "stability.output_dir"  # the run folder (steps.csv, journal, checkpoints)
    LOSS_NAME = "stability.loss_name"  # what the task's loss is ("BCE", "MSE"): axis labels
    STRATEGY = "stability.strategy"  # on a sweep's parent: how it planned (absent: the grid)
    ADAPTIVE_PLAN = "stability.adaptive_plan"  # on an adaptive sweep's parent: its settings (JSON)
    DECIDE_PLAN = "stability.decide_plan"  # on a decide sweep's parent: its settings (JSON)
    CHECK_OUTCOME = "stability.check_outcome"  # check run: pass | fail (any probe failed)
    # An experiment tag (MLflow 3.x UI): the experiment's type. Set to EXPERIMENT_KIND_TRAINING,
    # the UI opens the experiment on its runs table (model training), not on GenAI traces.
    EXPERIMENT_KIND = "mlflow.experimentKind"


# Tags whose name changed, new -> old: the report's "winner" tags became "chosen" (issue 59:
# one name for the decision's config); stores written before hold the old names.
RENAMED = {"stability.chosen": "stability.winner",
           "stability.chosen_label": "stability.winner_label",
           "stability.chosen_stability": "stability.winner_stability"}


def read_tag(tags: Mapping[str, str], key: str, default: str | None = None) -> str | None:
    """A run's tag ``key``, or its old name's value on a run written before it was renamed."""
    if key in tags:
        return tags[key]
    old = RENAMED.get(key)
    return tags.get(old, default) if old is not None else default


EXPERIMENT_KIND_TRAINING = "custom_model_development"  # the UI's "machine learning" kind
# MLflow 3.17's UI picks GenAI or model training per browser (a toggle kept in local storage,
# GenAI by default) and reads the experiment's kind only without that toggle; this query on an
# experiment link (``#/experiments/<id>?workflowType=machine_learning``) opens its runs table.
UI_TRAINING_VIEW = "?workflowType=machine_learning"


# Per optimizer step (MLflow step = optimizer step): the ``StepLog`` fields marked
# ``metric=True``, named as their steps.csv columns (core/steplog.py is their one source).
# Per epoch (MLflow step = epoch): metric name -> ``EpochLog`` field.
EPOCH_METRICS = {"train_loss": "train_loss", "val_loss": "val_loss", "val_acc": "val_acc",
                 "epoch_clip_fraction": "clip_fraction", "max_grad_norm": "max_grad_norm",
                 "epoch_skip_count": "skip_count"}
# Summary metrics (step 0) beyond the selection criterion: the validation loss before training
# (the LR sensitivity's reference, report/examine/lr.py) and, with telemetry.update_ratio, the
# median and maximum over the steps taken of ||delta theta|| / ||theta|| (core/layers.py).
LOSS_INIT = "loss_init"
UPDATE_RATIO_METRICS = ("update_ratio_p50", "update_ratio_max")
RUN_METRICS = (LOSS_INIT, *UPDATE_RATIO_METRICS)
# A run trained by a trainer we do not own (stability.integrations): its steps.csv column
# (1 when the trainer advanced an LR scheduler during the step; never in our loop's CSV) and
# the summary metric counting the skipped steps on which it did (Lightning #5558).
SCHEDULER_STEPPED = "scheduler_stepped"
SCHEDULER_STEPS_ON_SKIP = "scheduler_steps_on_skip"
TRAINER_PARAM = "trainer"  # every run's param: what trained it (ours | lightning | hf | plain)
WORLD_SIZE_PARAM = "world_size"  # logged only above 1 (data-parallel ranks)
TASK_TARGET_PARAM = "task._target_"  # the task's import path; its options are ``task.<key>``
# A check run: param ``check.<probe>`` = its status (pass | warn | fail | n/a), metric
# ``check.<probe>`` = its measured number (finite ones), beside the task's ``task.*`` params.
CHECK_PREFIX = "check."


class Artifact:
    """Artifact paths of a training run (relative to its artifact root and its output dir)."""

    STEPS_CSV = rundir.CSV_NAME
    CONFIG = rundir.CONFIG_NAME
    CHECKPOINT = rundir.CHECKPOINT_NAME
    LAYER_NORMS = rundir.LAYER_NORMS_NAME  # only with telemetry.per_layer=true
    LAYER_UPDATES = rundir.LAYER_UPDATES_NAME  # with per_layer and telemetry.update_ratio
    ALL = rundir.ARTIFACTS
    REPORT_MD = "report.md"  # report run: the review report
    REPORT_HTML = "report.html"  # report run: the same, self-contained (figures embedded)
    SUMMARY_CSV = "summary.csv"  # report run: one row per config, ranked
    LAYER_NORMS_FIGURE = "plots/layer_norms.png"  # report run: parameters x steps heatmap
    MODEL = "model"  # name of the winner's logged MLflow Model
    # sweep parent: JSON list of the run ids of training runs FINISHED before the sweep whose
    # points it skipped (a resumed sweep); its report reads them with its own runs
    ADOPTED_RUNS = "adopted_runs.json"
    # sweep parent: JSON {"planned": [[fingerprint, seed], ...], "launched": [run id, ...]},
    # the points it planned and the runs its own jobs created (tracking/children.py)
    SWEEP_RUNS = "sweep_runs.json"
    CHECK_JSON = "check.json"  # check run: every probe's status, number, tolerance and meaning


class Rebuild:
    """What a training run records so the report can read it and rebuild its winner.

    Any loop may produce such a run (``TrackedRun`` with plain params and tags): the report
    reads these names, never our ``RunConfig``.
    """

    # Grouping and selection: which sweep, which config (seeds share it), which seed, and what
    # the loss is (figures and tables say it). How it ended (``Tag.OUTCOME``) is ``TrackedRun``'s.
    TAGS = (Tag.KIND, Tag.SWEEP_ID, Tag.FINGERPRINT, Tag.SEED, Tag.LOSS_NAME)
    # The task: its import path (``task.<key>`` params are its options).
    PARAMS = (TASK_TARGET_PARAM,)
    # How the model is rebuilt: ``config.yaml`` holds the task section (target, options, the
    # sections it takes) and must hash to the fingerprint tag; the checkpoint holds the weights.
    ARTIFACTS = (Artifact.CONFIG, Artifact.CHECKPOINT)
    METRICS = ("best_val_loss",)  # the selection criterion, at step 0


def missing_records(tags: Mapping[str, str], params: Mapping[str, str]) -> list[str]:
    """The tags and params of ``Rebuild`` that a run lacks (empty: the report can read it).

    Args:
        tags: the run's tags.
        params: the run's params.
    """
    return ([f"tag {t}" for t in Rebuild.TAGS if not tags.get(t)]
            + [f"param {p}" for p in Rebuild.PARAMS if not params.get(p)])


def search_filter(kind: Kind, sweep_id: str | None = None, status: str | None = None) -> str:
    """An MLflow ``filter_string`` for runs of ``kind`` (of one sweep, with one status).

    Args:
        kind: the run kind.
        sweep_id: only runs of this sweep.
        status: only runs with this MLflow status (``FINISHED``, ``RUNNING``...).
    """
    parts = [f"tags.`{Tag.KIND}` = '{kind}'"]
    if sweep_id is not None:
        parts.append(f"tags.`{Tag.SWEEP_ID}` = '{quote(sweep_id)}'")
    if status is not None:
        parts.append(f"attributes.status = '{status}'")
    return " and ".join(parts)


def quote(value: str, key: str = "sweep_id") -> str:
    """``value`` checked to be safe inside a single-quoted MLflow filter string.

    MLflow does not unescape ``\\'`` in a filter, so a quote would silently match nothing:
    values put into filters (sweep ids, model names) are restricted to ``[A-Za-z0-9._-]``.

    Raises:
        ConfigError: ``value`` holds another character.
    """
    return safe_name(key, value)
