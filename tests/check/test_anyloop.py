"""``stability.check.loop``: a loop of one's own, checked without a rewrite.

The loop is examples/any_loop/nanogpt_loop.py's ``train_step``, written the way nanoGPT's
``train.py`` writes it (GradScaler, ``loss / gradient_accumulation_steps``, ``unscale_``,
``clip_grad_norm_``, ``scaler.step``, ``update``, ``zero_grad(set_to_none=True)``). The correct
loop exits 0; each planted bug (tests/check/test_matrix.py) fails its probe.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

import stability.check
from stability.check.anyloop import SUPPLIED
from tests.helpers.examples import example_module

ROOT = Path(__file__).resolve().parents[2]
ANY = ROOT / "examples" / "any_loop"


@pytest.fixture(scope="module")
def gpt():
    return example_module(ANY, "nanogpt_loop")


def _batches(gpt, k=4):
    g = torch.Generator().manual_seed(1)
    return [gpt.get_batch(g) for _ in range(k)]


def _loss(model, batch):
    return model(*batch)[1]


def test_the_example_check_exits_0_on_the_correct_loop(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ANY))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ANY / "check_loop.py"), run_name="__main__")
    assert done.value.code == 0, capsys.readouterr()
    body = json.loads((tmp_path / "check.json").read_text())
    status = {p["name"]: p["status"] for p in body["probes"]}
    assert body["exit_status"] == 0 and len(status) == 11
    assert status["accumulation.short_window"] == "n/a"  # short_window=False: nanoGPT samples
    assert status["schedule.per_step"] == "n/a"  # nanoGPT sets the LR itself: no scheduler
    assert {s for n, s in status.items() if n not in ("accumulation.short_window",
                                                      "schedule.per_step")} == {"pass"}
    assert "check: ok (0 failed of 11)" in capsys.readouterr().out


def test_a_parameter_the_check_cannot_supply_is_exit_2_naming_it(gpt, capsys):
    def step(model, optimizer, data_iter):
        pass

    code = stability.check.loop(step, gpt.TinyGPT(), _loss, _batches(gpt), output=None)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "train_step parameter data_iter" in err
    assert "window" in err and "grad_clip" in err
    code = stability.check.loop(gpt.train_step, gpt.TinyGPT(), _loss, _batches(gpt, 2),
                                accum_steps=4, output=None)
    assert code == 2 and "batches holds 2 micro-batches" in capsys.readouterr().err


def test_the_users_code_raising_is_exit_3_naming_the_function(gpt, tmp_path, capsys):
    def train_step(model, optimizer, scaler, window, grad_clip, ctx):
        if grad_clip:
            raise ValueError("no clipping in this loop")
        gpt.train_step(model, optimizer, scaler, window, len(window), grad_clip, ctx)

    out = tmp_path / "c.json"
    code = stability.check.loop(train_step, gpt.TinyGPT(), _loss, _batches(gpt), scaler=True,
                                output=out)
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1
    assert "test_the_users_code_raising_is_exit_3_naming_the_function.<locals>.train_step" in err
    assert "ValueError: no clipping in this loop" in err and "during clip.unscaled" in err
    body = json.loads(out.read_text())
    assert body["exit_status"] == 3 and [p["status"] for p in body["probes"]] == ["pass"] * 2


def test_supplied_names_cover_nanogpts_and_the_common_spellings():
    assert {"model", "optimizer", "scaler", "scheduler", "window", "batches", "accum_steps",
            "gradient_accumulation_steps", "grad_clip", "max_norm", "ctx"} <= set(SUPPLIED)


def test_every_user_mistake_is_one_line_exit_2(gpt, tmp_path, capsys):
    batches = _batches(gpt)
    cases = [
        ({"accept": ["lightning.shortwindow"]}, ["accept", "lightning.short_window |"]),
        ({"names": {"data": "batchez"}}, ["names['data']", "batches"]),
        ({"names": {"nope": "batches"}}, ["names=", "parameters of train_step"]),
    ]
    for kwargs, needles in cases:
        code = stability.check.loop(gpt.train_step, gpt.TinyGPT(), _loss, batches, output=None,
                                    **kwargs)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
        assert all(n in err for n in needles), err
    code = stability.check.loop(gpt.train_step, gpt.TinyGPT(), _loss, None, output=None)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "batches=None is invalid" in err, err
    # the loop named by where it is: its file's syntax or import error is its file:line
    bad = tmp_path / "broken_loop.py"
    bad.write_text("import torch\n\ndef train_step(model, optimizer, window)\n    pass\n")
    code = stability.check.loop(f"{bad}:train_step", gpt.TinyGPT(), _loss, batches, output=None)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "broken_loop.py:3: SyntaxError" in err, err
    missing = tmp_path / "missing_dep_loop.py"
    missing.write_text("import torch\nimport no_such_package_here\n\ndef train_step(model):\n"
                       "    pass\n")
    code = stability.check.loop(f"{missing}:train_step", gpt.TinyGPT(), _loss, batches,
                                output=None)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "missing_dep_loop.py:2" in err and "No module named 'no_such_package_here'" in err


def test_a_short_window_error_names_the_short_window_probe(gpt, capsys):
    def train_step(model, optimizer, scaler, window, gradient_accumulation_steps, grad_clip,
                   ctx):
        if len(window) < gradient_accumulation_steps:
            raise IndexError("the epoch's last window is short")
        gpt.train_step(model, optimizer, scaler, window, gradient_accumulation_steps,
                       grad_clip, ctx)

    code = stability.check.loop(train_step, gpt.TinyGPT(), _loss, _batches(gpt), output=None)
    err = capsys.readouterr().err
    assert code == 3 and "during accumulation.short_window: IndexError" in err, err


def test_the_loops_own_names_and_settings_it_uses_unconditionally(gpt, capsys):
    # a loop that names its data its own way, clips and steps its scheduler unconditionally:
    # the probes pass a max_norm and a scheduler that work (never None)
    def train_step(model, optimizer, scaler, data, iters_to_accumulate, max_norm, scheduler):
        for X, Y in data:
            _, loss = model(X, Y)
            scaler.scale(loss / len(data)).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() >= scale:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    code = stability.check.loop(train_step, gpt.TinyGPT(), _loss, _batches(gpt), scaler=True,
                                names={"data": "batches", "iters_to_accumulate": "accum_steps"},
                                output=None)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "schedule.per_step          pass" in out and "check: ok (0 failed of 11)" in out


# --- top-level loops as published: the lines of their own file (stability.check.body) --------

def _run_example(name, tmp_path, monkeypatch, source=None):
    """``STABILITY_CHECK=1 python <name>`` in this process (from a copy when ``source``)."""
    path = ANY / name
    if source is not None:
        path = tmp_path / name
        path.write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ANY))
    monkeypatch.setenv("STABILITY_CHECK", "1")
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    body = json.loads((tmp_path / "check.json").read_text())
    return done.value.code, {p["name"]: p for p in body["probes"]}


def _added(name):
    """The lines under the example's STABILITY_CHECK flag: all a user adds."""
    lines = (ANY / name).read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith("if os.environ.get("))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    "))
    return end - start


@pytest.mark.slow
@pytest.mark.parametrize(("name", "added"), [("amp_recipe.py", 5), ("nanogpt_train.py", 4)])
def test_the_published_loops_are_checked_as_written(name, added, tmp_path, monkeypatch):
    assert _added(name) == added
    code, got = _run_example(name, tmp_path, monkeypatch)
    assert code == 0, {n: (p["status"], p["meaning"]) for n, p in got.items()}
    for probe in ("accumulation.full", "clip.unscaled", "skip.is_skip", "sanity.same_seed"):
        assert got[probe]["status"] == "pass", got[probe]


@pytest.mark.slow
def test_the_loops_own_autocast_is_reported_as_such_and_a_bug_in_it_still_fails(tmp_path,
                                                                                monkeypatch):
    recipe = (ANY / "amp_recipe.py").read_text()
    # the recipe as a CPU user adapts it: its own fp16 autocast, whatever the probe asks
    own = recipe.replace('device_type="cuda"', 'device_type="cpu"')
    code, got = _run_example("amp_recipe.py", tmp_path, monkeypatch, own)
    full = got["accumulation.full"]
    assert code == 0 and full["status"] == "warn", full
    assert "runs its own fp16 autocast" in full["meaning"] and "padded" not in full["meaning"]
    # the same loop without the division by iters_to_accumulate: a failure, named
    bug = own.replace("loss = loss / iters_to_accumulate", "loss = loss")
    code, got = _run_example("amp_recipe.py", tmp_path, monkeypatch, bug)
    full = got["accumulation.full"]
    assert code == 1 and full["status"] == "fail", full
    assert "not divided by the window's micro-batch count" in full["meaning"], full


def test_a_loops_lines_that_do_not_parse_or_read_unknown_names_are_one_line(gpt, tmp_path,
                                                                            capsys):
    src = tmp_path / "train.py"
    src.write_text("import torch\nfor X, Y in data:\n    loss = model(X, Y)[1] / n\n"
                   "    loss.backward()\noptimizer.step()\n")
    for spec, needle in [(f"{src}:2-5", "reads n, which the check does not supply"),
                         (f"{src}:2-9", "lines within 1-5")]:
        code = stability.check.loop(spec, gpt.TinyGPT(), _loss, _batches(gpt), output=None,
                                    names={"data": "batches"})
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and needle in err, err
    src.write_text("import torch\nfor X, Y in data:\n    loss = model(X, Y)[1] /\n")
    code = stability.check.loop(f"{src}:2-3", gpt.TinyGPT(), _loss, _batches(gpt),
                                output=None)
    err = capsys.readouterr().err
    assert code == 2 and "train.py:3: SyntaxError" in err, err
