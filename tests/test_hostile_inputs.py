"""Hostile values in every field the report reads (issue 31): property-based, in-process.

Hypothesis feeds interpolations, backticks, ``](``, markup, path traversal, huge numbers and
``nan``/``inf``/``abc`` into the params and tags of a recorded run (``fetch._row`` on a real
MLflow ``Run`` entity), into a recorded ``config.yaml`` (``trust.trusted_config``), into the
labels built from them and into the report's markdown (``html.to_html``, ``note_markdown``).
Each must end in data or one refusal: no crash, no module imported, no markup from a value.
The real reports over a store with a fixed set of these values are in
tests/test_report_trust.py and tests/test_report_bad_runs.py.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stability.core.config import ConfigError, to_run_config, to_yaml_dict
from stability.core.identity import config_label, fingerprint
from stability.report.fetch import TYPED_PARAMS, UNREADABLE, _row
from stability.report.html import inert, inline, note_markdown, to_html
from stability.report.trust import BUILTIN_TASKS, Untrusted, trusted_config
from stability.tracking.contract import Tag
from tests.test_report_bad_runs import a_run
from tests.test_report_trust import assert_inert

KNOWN = ["${oc.create:'{_target_: builtins.open, file: /tmp/x, mode: w}'}", "${oc.env:HOME}",
         "`", "](", "[x](/etc/passwd)", "![i](http://evil/x.png)", "<script>alert(1)</script>",
         "../../etc/passwd", "/etc/passwd", "1e400", "9" * 5000, "nan", "inf", "-inf", "abc",
         "None", "", "_target_", "\n## Answer\n", "| a | b |", "**x**", "\x00"]
HOSTILE = st.one_of(st.sampled_from(KNOWN), st.text(max_size=40),
                    st.lists(st.sampled_from(KNOWN) | st.text(max_size=8), max_size=4)
                    .map("".join))
KEYS = sorted(TYPED_PARAMS) + ["precision.name", "clip.method", "task.n", "data.seq_len"]
MARKUP = ("`", "](", "![")
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _modules() -> set[str]:
    return set(sys.modules)


@SETTINGS
@given(values=st.dictionaries(st.sampled_from(KEYS), HOSTILE, max_size=4),
       seed=HOSTILE, fp=HOSTILE, reason=HOSTILE)
def test_a_runs_params_and_tags_are_read_as_inert_data(values, seed, fp, reason) -> None:
    before = _modules()
    good = {"clip.enabled": "True", "clip.max_norm": "1.0", "clip.clip_value": "0.5",
            "train.accum_steps": "2", "train.epochs": "3", "train.lr": "0.001",
            "precision.name": "fp32", "clip.method": "norm"}
    row = _row(a_run(good | values, {Tag.SEED: seed, Tag.FINGERPRINT: fp, Tag.REASON: reason}))
    assert _modules() == before
    for key in TYPED_PARAMS:  # a number the report computes with, or the run is marked
        assert isinstance(row[key], bool | int | float)
    assert isinstance(row["seed"], int)
    assert all(v == good.get(k) for k, v in values.items() if k in TYPED_PARAMS) \
        or row["outcome"] == UNREADABLE or all(TYPED_PARAMS[k](v) == row[k] for k, v in
                                               values.items() if k in TYPED_PARAMS)
    for value in row.values():
        if isinstance(value, str):
            assert value.isprintable() and not any(m in value for m in MARKUP), value
    label = config_label(row)
    assert "<a " not in inline(f"`{label}` {label}") and "<img" not in inline(label)
    note = note_markdown(f"winner `{label}` ({row['reason']})")
    assert not any(m in note.replace(f"`{label}`", "") for m in ("](", "![")), note


def _own_yaml() -> dict:
    return yaml.safe_load(yaml.safe_dump(to_yaml_dict(to_run_config({}))))


@SETTINGS
@given(where=st.sampled_from(["task", "data", "model", "train", "optim", "list", "key"]),
       value=HOSTILE | st.integers() | st.floats())
def test_a_recorded_config_is_rebuilt_or_refused_never_run(where, value) -> None:
    own = _own_yaml()
    trusted_config(own, fingerprint(to_run_config(own)), BUILTIN_TASKS)  # imports done once
    raw = _own_yaml()
    before = _modules()
    if where == "list":
        raw["model"]["cell"] = [value, {"x": value}]
    elif where == "key":
        raw["data"] = {**raw["data"], str(value): 1}
    else:
        raw[where] = {**(raw.get(where) or {}), "planted": value}
    try:
        cfg = to_run_config(raw)
        expected = fingerprint(cfg)
    except (ConfigError, TypeError, ValueError):
        expected = "x"
    with contextlib.suppress(Untrusted, ConfigError):  # rebuilt, or refused with a reason
        trusted_config(raw, expected, BUILTIN_TASKS)
    if isinstance(value, str) and "${" in value:  # never accepted, whatever hashes to what
        try:
            trusted_config(raw, expected, BUILTIN_TASKS)
            raise AssertionError(f"accepted an interpolation: {value!r}")
        except Untrusted as err:
            assert "interpolation" in str(err)
    assert _modules() == before


@SETTINGS
@given(values=st.lists(HOSTILE, min_size=1, max_size=4))
def test_the_page_and_the_note_hold_no_markup_from_a_value(values, tmp_path_factory) -> None:
    folder = Path(tmp_path_factory.mktemp("page"))
    cells = [" ".join(inert(v).replace("|", "\\|").split()) for v in values]
    md = "\n".join([f"# `{cells[0]}`", f"- `{cells[-1]}`: {cells[0]}", cells[-1],
                    "| a | b |", "|---|---|", f"| `{cells[0]}` | {cells[-1]} |"])
    page = to_html(md, folder, values[0])
    assert_inert(page)
    assert "<a " not in page and "<img" not in page
    note = note_markdown(md)
    assert "](" not in note and "![" not in note
