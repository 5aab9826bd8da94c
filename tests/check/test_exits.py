"""``stability check``'s exit statuses, as a CI reads them, and its one-line errors.

0 every probe passed, warned, was n/a or accepted; 1 a probe failed; 2 bad input (one line
naming the key and the allowed values, no traceback); 3 the code under check raised (one line
naming the function or hook and the exception; the JSON keeps the probes that ran). Each case
calls the real entry point (``stability.cli.main``) in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stability.check.rig import Rig
from tests.helpers.in_process import in_process

ROOT = Path(__file__).resolve().parents[2]
LIGHTNING = ROOT / "examples" / "lightning_task"


def raises_in_the_window(rig: Rig, window) -> bool:
    """A step function whose own code raises when it clips (a user's bug)."""
    if rig.max_norm is not None:
        raise KeyError(f"max_norm {rig.max_norm:.3g}")
    from stability.check.rig import ours

    return ours(rig, window)


def _one_line(done, *needles):
    assert done.code == 2, (done.code, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    for n in needles:
        assert n in done.stderr, done.stderr


@pytest.mark.parametrize(("cwd", "argv", "needles"), [
    (ROOT, ["check.accum_steps=500"], ["check.accum_steps=500", "at most 32",
                                        "micro-batches"]),
    (LIGHTNING, ["--config-dir", ".", "task=nope"], ["task=nope", "spirals", "sign_sum"]),
    (LIGHTNING, ["task=nope", "--config-dir", "."], ["task=nope", "spirals"]),
    (ROOT, ["+check.bogus=1"], ["check.bogus is not a key of check",
                                "loop | accum_steps | output | accept"]),
    (ROOT, ["check.accept=[pytorch.anything]"], ["check.accept", "lightning.short_window"]),
    (ROOT, ["check.loop=no.such.module"], ["check.loop='no.such.module'", "ours"]),
    (ROOT, ["foo=1"], ["Could not override 'foo'", "+foo=1"]),
    (ROOT, ["check.accept=[lightning.short_window"], [
        "check.accept=[lightning.short_window does not parse"]),
], ids=["accum-bound", "task-config-dir", "task-before-flag", "bogus-key", "accept",
        "loop", "unknown-override", "unparsable"])
def test_bad_input_is_one_line_and_exit_2(cwd, argv, needles, monkeypatch, capsys):
    monkeypatch.chdir(cwd)
    _one_line(in_process(["check", *argv, "tracking.enabled=false"], capsys), *needles)


def test_an_override_after_config_dir_reaches_hydra(monkeypatch, capsys):
    # Hydra reads one run of overrides: ours are regrouped after its flags, so the value is
    # read (here it is out of bounds: the one-line error proves it arrived)
    monkeypatch.chdir(LIGHTNING)
    done = in_process(["check", "task=spirals", "--config-dir", ".", "check.accum_steps=500",
                       "tracking.enabled=false"], capsys)
    _one_line(done, "check.accum_steps=500", "at most 43")


def test_the_code_under_check_raising_is_exit_3_with_the_probes_that_ran(tmp_path,
                                                                         monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "c.json"
    done = in_process(["check", "check.loop=tests.check.test_exits.raises_in_the_window",
                       f"check.output={out}", "tracking.enabled=false"], capsys)
    assert done.code == 3, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "raises_in_the_window (test_exits.py:" in done.stderr
    assert "KeyError" in done.stderr and "during clip.unscaled" in done.stderr
    body = json.loads(out.read_text())
    assert body["exit_status"] == 3 and "raises_in_the_window" in body["error"]
    # the probes before it ran and are kept
    assert [(p["name"], p["status"]) for p in body["probes"]] == [
        ("accumulation.full", "pass"), ("accumulation.short_window", "pass")]


@pytest.mark.parametrize(("source", "code", "needles"), [
    ("def step(rig, window)\n    return True\n", 2, ["bad_loop_a.py:1: SyntaxError"]),
    ("import no_such_dependency_x\n", 2, ["bad_loop_b.py:1", "no_such_dependency_x"]),
    ("raise ValueError('configured wrong')\n", 3, [
        "raised in <module> (bad_loop_c.py:1) during importing check.loop",
        "ValueError: configured wrong"]),
], ids=["syntax", "import", "raises"])
def test_a_loop_file_that_does_not_import_is_one_line(source, code, needles, tmp_path,
                                                      monkeypatch, capsys):
    name = {2: "bad_loop_a", 3: "bad_loop_c"}[code] if "import" not in source[:6] else \
        "bad_loop_b"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    done = in_process(["check", f"check.loop={name}.step", "tracking.enabled=false",
                       f"check.output={tmp_path / 'c.json'}"], capsys)
    assert done.code == code, (done.code, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    for n in needles:
        assert n in done.stderr, done.stderr
