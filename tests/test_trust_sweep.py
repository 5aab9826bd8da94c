"""No code from a checkpoint, no folder a tag names, no adopted run unchecked (issue 31).

The sweep, tracking and integration side of the second trust pass: real MLflow stores (SQLite),
real run folders and the real HF Trainer; the hostile parts are planted as an attacker who can
write runs into the experiment (or files into a handed-over folder) would plant them.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

MARKER = "stability-issue31-pwned"


class _Payload:
    """Unpickling this runs ``open(<marker>, 'w')``: the proof that a load ran code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_pickled_callback_state_in_an_hf_checkpoint_runs_no_code(tmp_path: Path) -> None:
    """B: an HF checkpoint whose ``stability_callback.pt`` is a pickle (not plain data):
    resuming from it refuses the file in one line, and the pickle never runs."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stability.integrations.hf import STATE_NAME, StabilityCallback
    from tests.helpers.trainer_tasks import TinyHFTask

    class Crash(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == 14:
                raise RuntimeError("crash")

    task = TinyHFTask()
    train_set, val_set = task.train_val()

    def fit(crash: bool = False, resume: str | None = None) -> None:
        torch.manual_seed(0)
        args = TrainingArguments(output_dir=str(tmp_path / "hf"), num_train_epochs=2, seed=0,
                                 eval_strategy="epoch", save_strategy="epoch", use_cpu=True,
                                 report_to="none", disable_tqdm=True, logging_strategy="no",
                                 **task.training_arguments())
        trainer = Trainer(model=task.model(), args=args, train_dataset=train_set,
                          eval_dataset=val_set)
        StabilityCallback(tmp_path / "run").attach(trainer)
        if crash:
            trainer.add_callback(Crash())
        trainer.train(resume_from_checkpoint=resume)

    with pytest.raises(RuntimeError, match="crash"):
        fit(crash=True)
    saved = tmp_path / "hf" / "checkpoint-12" / STATE_NAME
    assert saved.exists()
    marker = tmp_path / MARKER
    planted = {"torch.save": lambda f: torch.save({"meter": _Payload(marker)}, f),
               "pickle": lambda f: pickle.dump({"meter": _Payload(marker)}, f)}
    for how, plant in planted.items():
        with saved.open("wb") as f:
            plant(f)
        with pytest.raises(Exception) as err:
            fit(resume=str(saved.parent))
        assert not marker.exists(), f"the {how} payload ran"
        assert isinstance(err.value, ValueError), err.value
        assert str(err.value).startswith(f"refusing {saved}: not plain data"), err.value
        assert "\n" not in str(err.value)
