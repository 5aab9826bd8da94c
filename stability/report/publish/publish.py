"""The report in MLflow: a ``report`` run with the report's files, and the Model Registry.

Re-running a report on the same sweep creates a new report run (each is a dated record) but
no new model version: the version an earlier report of this sweep registered for the same
winner is reused. What MLflow records of a version (its tags, its run, its source, the report
run that logged its model, that run's tags) is written by anyone who may create runs in the
experiment or versions of the model, so none of it proves a version is ours: a planted pyfunc
version dressed as this sweep's was reused and ``@champion`` moved to it. The proof is local:
each version a report registers is written into the ledger in its own report folder (the
user's disk, which no teammate writes), and only a version named there, with the same source,
run and store, is reused (``ledger.own``); any other is passed over and a new one registered.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from stability.core.validation import safe_name
from stability.report.decide.select import SELECTION_RULE
from stability.report.evidence.fetch import Sweep
from stability.report.options import ReportError
from stability.report.present.html import note_markdown
from stability.report.publish import ledger
from stability.report.publish.signature import signature_warning, versions
from stability.report.sealed.evaluate import LoadableWinner, WinnerTestResult
from stability.tracking import origins
from stability.tracking.contract import Artifact, Kind, Tag

if TYPE_CHECKING:
    from stability.report.decide.table import ConfigRow

log = logging.getLogger(__name__)

MAX_TAG = 5000  # MLflow's tag value limit
CHAMPION = "champion"  # registry alias of the newest winner


def start_report_run(c: Any, sweep: Sweep, winner: Mapping[str, Any], git_commit: str) -> str:
    """Create the report run in the sweep's experiment; returns its id."""
    tags = {
        Tag.KIND: Kind.REPORT.value,
        Tag.SWEEP_ID: sweep.sweep_id,
        Tag.SWEEP_RUN_ID: sweep.parent_run_id or "",
        Tag.WINNER: str(winner["fingerprint"]),
        Tag.WINNER_LABEL: str(winner["label"]),
        Tag.SELECTION_RULE: SELECTION_RULE[:MAX_TAG],
        Tag.GIT_COMMIT: git_commit,
    }
    run = c.create_run(sweep.experiment_id, tags=tags, run_name=f"report {sweep.sweep_id}")
    return str(run.info.run_id)


def tag_findings(c: Any, run_id: str, winner: ConfigRow, recs: list[Any]) -> None:
    """The winner's stability verdict and the max_norm recommendation, as report-run tags."""
    tags = {Tag.WINNER_STABILITY: winner.stability}
    if recs:
        tags[Tag.MAX_NORM_RECOMMENDATION] = "; ".join(r.tag() for r in recs)[:MAX_TAG]
    for key, value in tags.items():
        c.set_tag(run_id, key, value)


def annotate_parent(c: Any, sweep: Sweep, report_run_id: str, winner: ConfigRow,
                    answer: str, model_uri: str) -> None:
    """Put the answer on the sweep's parent run, where a user browsing the UI lands first.

    ``mlflow.note.content`` is the run's description (markdown on its UI page): the answer
    and links to the report run and its ``report.html``; tags name the winner. Best effort:
    the report is already complete and logged when this runs.
    """
    if not sweep.parent_run_id:
        return
    run = f"#/experiments/{sweep.experiment_id}/runs/{report_run_id}"
    links = (f"[Report run]({run}) · [report.html]({run}/artifactPath/{Artifact.REPORT_HTML})"
             + (f" · model `{model_uri}`" if model_uri else ""))
    note = f"## Stability report\n\n{links}\n\n{note_markdown(answer)}"
    if len(note) > MAX_TAG:
        note = note[:MAX_TAG - 60].rsplit("\n", 1)[0] + "\n\n…(cut: see the report run)"
    tags = {Tag.NOTE: note, Tag.REPORT_RUN_ID: report_run_id,
            Tag.WINNER: winner.fingerprint, Tag.WINNER_LABEL: winner.label,
            Tag.WINNER_STABILITY: winner.stability}
    try:
        for key, value in tags.items():
            c.set_tag(sweep.parent_run_id, key, value)
    except Exception:  # the report run holds everything; the parent's note is a convenience
        log.exception("could not annotate the sweep's parent run %s", sweep.parent_run_id)


def summary_metrics(test: WinnerTestResult) -> dict[str, float]:
    """The winner's test loss/accuracy mean and std, as logged on the report run."""
    return {"test_loss_mean": test.loss.mean, "test_loss_std": test.loss.std,
            "test_acc_mean": test.acc.mean, "test_acc_std": test.acc.std,
            "test_seeds": float(test.loss.n)}


def report_folder(output_dir: Path, sweep_id: str) -> Path:
    """``<output_dir>/<sweep_id>``, created; refused unless it is a real folder inside it.

    Raises:
        ReportError: the sweep id is not a plain name, or the folder (or ``plots/`` in it) is
            a link or leads outside ``output_dir``.
    """
    safe_name("sweep_id", sweep_id)
    output_dir.mkdir(parents=True, exist_ok=True)
    folder = output_dir / sweep_id
    folder.mkdir(exist_ok=True)
    inside = folder.resolve().parent == output_dir.resolve()
    for path in (folder, folder / "plots"):
        if path.is_symlink() or not inside:
            raise ReportError(f"output_dir={str(output_dir)!r} is invalid: {path} is a link or "
                              "leads outside it; allowed values are a folder whose report "
                              "folders are plain folders (remove the link)")
    return folder


def install(staging: Path, folder: Path, files: Sequence[str]) -> None:
    """Move the report's own ``files`` from ``staging`` into ``folder`` (``os.replace``: a
    link already at a file's place is replaced, never written through)."""
    for rel in files:
        dest = folder / rel
        dest.parent.mkdir(exist_ok=True)
        os.replace(staging / rel, dest)


def finish_report_run(c: Any, run_id: str, folder: Path, metrics: Mapping[str, float],
                      files: Sequence[str]) -> None:
    """Log the summary metrics and the report's own ``files`` (paths relative to ``folder``,
    which may hold other files: they are not uploaded); end the run FINISHED."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    c.log_batch(run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()],
                synchronous=True)
    uri = origins.run_uri(c, run_id)  # the report run's own location, checked
    for rel in files:
        parent = str(PurePosixPath(rel).parent)
        origins.upload(c, run_id, folder / rel, None if parent == "." else parent, uri)
    c.set_terminated(run_id, status="FINISHED")


def fail_report_run(c: Any, run_id: str, err: BaseException) -> None:
    """End the report run FAILED with the reason (best effort: the original error matters)."""
    try:
        c.set_tag(run_id, Tag.REASON, f"{type(err).__name__}: {err}"[:MAX_TAG])
        c.set_terminated(run_id, status="FAILED")
    except Exception:  # the tracking server may be the reason; keep the first error
        log.exception("could not close report run %s", run_id)


@dataclass(frozen=True)
class Candidate:
    """What a report registers: the winner's best seed, its test and its loadable model.

    Attributes:
        sweep: the sweep.
        winner: the winner's row of the ranked config table.
        run: the training run whose checkpoint is registered (the winner's seed with the
            lowest best validation loss: chosen on validation, never on test).
        test: the winner's test evaluation (its numbers become version tags).
        loadable: that run's rebuilt model and input example (``evaluate.load_winner``).
        report_run_id: the report run that registers it.
        folder: the report folder; its ledger (``ledger.LEDGER``) names the versions its
            reports registered (None: no version is reused).
    """

    sweep: Sweep
    winner: ConfigRow
    run: Mapping[str, Any]
    test: WinnerTestResult
    loadable: LoadableWinner
    report_run_id: str
    folder: Path | None = None


def register_winner(c: Any, uri: str, name: str, candidate: Candidate,
                    notes: list[str] | None = None) -> tuple[str, bool]:
    """Log the winner as an MLflow Model, register it once per (sweep, winner), alias champion.

    The model is logged with ``mlflow.pytorch.log_model`` into the report run (``name="model"``,
    pt2 format: a traced graph that loads without this package's code), with a signature and an
    input example from the validation split and the run's ``config.yaml``; the registered
    version points at that logged model and names the training run whose weights it holds.
    The alias ``champion`` moves to this version (aliases, not the deprecated stages).

    Args:
        c: the MLflow client.
        uri: its tracking URI (``log_model`` resolves the global one).
        name: the registered model name.
        candidate: the winner's run, test and model, and the report run that registers it.
        notes: receives a warning when the new version's input signature differs from the
            previous version's (two studies sharing one name: ``signature_warning``).

    Returns:
        ``(version, created)``; ``created`` is False when an existing version was reused.
    """
    from mlflow.exceptions import MlflowException

    sweep, winner, run, test = candidate.sweep, candidate.winner, candidate.run, candidate.test
    report_run_id = candidate.report_run_id
    fp = winner.fingerprint
    entries = ledger.read(candidate.folder)
    for v in versions(c, name):
        if ledger.own(v, uri, entries, fp, str(run["run_id"])):
            log.info("model %s version %s already holds this winner; not registering again",
                     name, v.version)
            c.set_registered_model_alias(name, CHAMPION, v.version)
            c.set_tag(report_run_id, Tag.MODEL_URI, f"models:/{name}@{CHAMPION}")
            return str(v.version), False
    try:
        c.create_registered_model(name, description="Winning config of a stability sweep "
                                  "(selected on validation loss; see its report run). "
                                  f"Load the newest with mlflow.pyfunc.load_model("
                                  f"'models:/{name}@{CHAMPION}').")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    seed_test = next((s for s in test.seeds if s.run_id == run["run_id"]), None)
    tags = {
        "sweep_id": sweep.sweep_id,
        "winner": fp,
        "config": winner.label,
        "seed": str(run["seed"]),
        "training_run_id": str(run["run_id"]),
        "report_run_id": report_run_id,
        "best_val_loss": f"{run['best_val_loss']:.6g}",
        **{k: f"{v:.6g}" for k, v in summary_metrics(test).items()},
    }
    if seed_test is not None and math.isfinite(seed_test.test_loss):
        tags |= {"test_loss": f"{seed_test.test_loss:.6g}", "test_acc": f"{seed_test.test_acc:.6g}"}
    exp = c.get_experiment(sweep.experiment_id)  # read now: log_model uploads below it
    origins.check(c.tracking_uri, str(exp.artifact_location), f"experiment '{exp.name}'")
    info = _log_model(uri, sweep.experiment_id, report_run_id, candidate.loadable)
    warning = signature_warning(c, name, info.signature)
    if warning:
        log.warning(warning)
        if notes is not None:
            notes.append(warning)
    mv = c.create_model_version(name, source=info.model_uri, run_id=str(run["run_id"]),
                                tags=tags, description=_description(candidate, seed_test),
                                model_id=info.model_id)
    ledger.remember(candidate.folder, ledger.entry(uri, name, str(mv.version), str(mv.source),
                                                   fp, str(run["run_id"]), report_run_id))
    c.set_registered_model_alias(name, CHAMPION, mv.version)
    c.set_tag(report_run_id, Tag.MODEL_URI, f"models:/{name}@{CHAMPION}")
    return str(mv.version), True


RNN_FLAT_WEIGHTS = (r"The tensor attributes? (self\.[\w.]*_flat_weights\[\d+\](, )?)+ "
                    r"(was|were) assigned during export")


# mlflow.pytorch ends by importing its Lightning autolog module, only to export a checkpoint
# callback the report never uses; where Lightning is installed that import is ~4-5 s of CPU in
# each report that registers a model (docs/performance.md, "Where a process's CPU goes").
_LIGHTNING_AUTOLOG = "mlflow.pytorch._lightning_autolog"


def _pytorch_flavor() -> Any:
    """``mlflow.pytorch`` without its Lightning autolog import (restored for later importers)."""
    import importlib
    import sys

    if "mlflow.pytorch" in sys.modules or _LIGHTNING_AUTOLOG in sys.modules:
        return importlib.import_module("mlflow.pytorch")
    sys.modules[_LIGHTNING_AUTOLOG] = None  # its import raises ImportError, which MLflow expects
    try:
        return importlib.import_module("mlflow.pytorch")
    finally:
        # a later mlflow.pytorch.autolog() in this process imports the module as usual
        del sys.modules[_LIGHTNING_AUTOLOG]


def _log_model(uri: str, experiment_id: str, run_id: str, w: LoadableWinner) -> Any:
    import mlflow
    import torch
    from mlflow.models import infer_signature

    mlflow.set_tracking_uri(uri)
    # The logged model belongs to the report run's experiment. Without an active experiment
    # MLflow files it under the Default one (id 0), where a team server's users may only read.
    mlflow.set_experiment(experiment_id=experiment_id)
    with torch.no_grad():
        out = w.model(torch.from_numpy(w.example)).numpy()
    torch_version = torch.__version__.split("+")[0]  # the local build tag is not on PyPI
    with warnings.catch_warnings():
        # torch.export notes that an nn.RNN/GRU/LSTM (at any depth: a trainer's wrapper, a
        # user's module) re-assigns its flat weight list while tracing; the exported graph
        # still holds every weight (the pyfunc test predicts with it). Only when every
        # attribute it names is such a list: any other assigned tensor is still reported.
        warnings.filterwarnings("ignore", message=RNN_FLAT_WEIGHTS)
        return _pytorch_flavor().log_model(
            w.model, name=Artifact.MODEL, run_id=run_id,
            signature=infer_signature(w.example, out), input_example=w.example,
            serialization_format="pt2",
            # explicit: inferring requirements would import the model in a subprocess
            pip_requirements=[f"torch=={torch_version}", f"mlflow=={mlflow.__version__}"],
            metadata={"config_yaml": w.config_text, "training_run_id": w.run_id})


def _description(candidate: Candidate, seed_test: Any) -> str:
    sweep, winner, run, test = candidate.sweep, candidate.winner, candidate.run, candidate.test
    seed_line = (f"; this seed: test loss {seed_test.test_loss:.4f}, test accuracy "
                 f"{seed_test.test_acc:.4f}" if seed_test is not None
                 and math.isfinite(seed_test.test_loss) else "")
    return (
        f"Config `{winner.label}` (fingerprint {winner.fingerprint}), seed {run['seed']} "
        f"(training run {run['run_id']}, best validation loss {run['best_val_loss']:.4f}) of "
        f"sweep {sweep.sweep_id}.\n\nSelection rule: {SELECTION_RULE}.\n\nTest (sealed split, "
        f"{test.test_size} sequences, opened once after selection): loss {test.loss.mean:.4f} ± "
        f"{test.loss.std:.4f}, accuracy {test.acc.mean:.4f} ± {test.acc.std:.4f} over "
        f"{test.loss.n} seeds (mean ± std){seed_line}.\n\nInput: float32 sequences (batch, "
        "seq_len, 1); output: one logit per sequence (sigmoid > 0.5 = positive sum)."
    )
