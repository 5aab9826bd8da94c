"""A run that records only what ``contract.Rebuild`` lists is reported (issue 33, item 5)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from stability.core.identity import config_label
from stability.report.decide.select import aggregate
from stability.report.evidence.fetch import val_acc_at_best
from tests.helpers.in_process import call, in_process

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_without_best_epoch_has_no_accuracy_at_best_instead_of_an_index_error():
    runs = pd.DataFrame({"run_id": ["a", "b"], "outcome": ["finished"] * 2,
                         "best_val_loss": [0.3, 0.4]})
    assert val_acc_at_best(None, runs).isna().all()  # no MLflow call: nothing to look up


def test_absent_factor_params_are_not_swept_and_named_unknown():
    runs = pd.DataFrame({"run_id": ["a", "b"], "fingerprint": ["f", "f"], "seed": [0, 1],
                         "outcome": ["finished"] * 2, "best_val_loss": [0.3, 0.4],
                         "run_name": ["mine s=0", "mine s=1"]})
    [row] = aggregate(runs).to_dict("records")
    assert row["loss_mean"] == pytest.approx(0.35)
    assert config_label({}) == "? clip=? acc=?"


MINIMAL = '''
import sys
from pathlib import Path
from stability.core.config import RunConfig, TrackingConfig, TrainConfig
from stability.core.identity import fingerprint
from stability.core.loop import train
from stability.tracking.contract import Kind, Tag
from stability.tracking.run import RunRecord, TrackedRun

root = Path(sys.argv[1])
for seed in (0, 1):
    cfg = RunConfig(seed=seed, device="cpu", output_dir=str(root / f"run{seed}"),
                    train=TrainConfig(epochs=1))
    best = train(cfg).best_val_loss
    tags = {Tag.KIND: Kind.TRAIN, Tag.SWEEP_ID: "minimal", Tag.FINGERPRINT: fingerprint(cfg),
            Tag.SEED: str(seed), Tag.LOSS_NAME: "BCE"}
    record = RunRecord(params={"task._target_": cfg.task.target}, tags=tags,
                       folder=Path(cfg.output_dir), name=f"mine s={seed}",
                       tracking=TrackingConfig(uri=f"sqlite:///{root}/mlflow.db",
                                               experiment="minimal"))
    with TrackedRun(record) as run:
        run.finish({"best_val_loss": best}, "finished")
'''


@pytest.mark.slow
def test_two_seeds_tracked_by_hand_with_only_the_contract_are_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # the user's script and `stability report`, each run in this process as its own main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")

    def script() -> None:
        sys.argv = ["minimal.py", str(tmp_path)]
        exec(compile(MINIMAL, "minimal.py", "exec"), {"__name__": "__main__"})  # noqa: S102

    assert call(script, capsys).code == 0
    done = in_process(["report", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                       "experiment=minimal", f"output_dir={tmp_path / 'reports'}"], capsys)
    assert done.code == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    report = (tmp_path / "reports" / "minimal" / "report.md").read_text()
    # named, not silent (a note's backticks are made inert at the way in: docs/report.md)
    assert re.search(r"2 finished run\(s\) lack .step_time_median_s.", report)


def test_only_torch_exports_note_on_rnn_flat_weights_is_silenced():
    """The report's terminal: torch.export's note on a GRU's flat weights (any module path) is
    not the user's business; any other tensor attribute assigned during export still is."""
    import re

    from stability.report.publish.publish import RNN_FLAT_WEIGHTS

    note = ("The tensor attributes self.module.gru._flat_weights[0], self.module.gru."
            "_flat_weights[1] were assigned during export. Such attributes must be registered")
    assert re.match(RNN_FLAT_WEIGHTS, note)
    assert re.match(RNN_FLAT_WEIGHTS, "The tensor attribute self.rnn._flat_weights[0] was "
                    "assigned during export.")
    assert not re.match(RNN_FLAT_WEIGHTS, "The tensor attributes self.gru._flat_weights[0], "
                        "self.scale were assigned during export.")
