"""The report reads MLflow as untrusted data (issue 19): what a teammate with write access to
the experiment plants in tags, params and artifacts is shown escaped, never built, never
followed out of ``output_dir``, and a bad file marks its run instead of ending the report.

Real SQLite stores and real runs (tests/helpers/report_fixtures.py); nothing is mocked.
"""

from __future__ import annotations

import html.parser
import math
import time
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from stability.core.config import ConfigError, to_run_config
from stability.core.identity import fingerprint, flatten
from stability.core.loop import CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME
from stability.report import ReportConfig, build_report
from stability.report.evidence.trust import BUILTIN_TASKS, Untrusted, allowed_tasks, trusted_config
from stability.report.options import ReportError
from stability.report.present.html import inline, note_markdown, safe_href, to_html
from stability.tracking.contract import Tag
from tests.helpers.report_fixtures import Spec, make_sweep, run_config
from tests.helpers.stores import sqlite_store

HOSTILE = ('x"><script>alert(1)</script><img src=x onerror=alert(2)>'
           "[click](javascript:alert(3))\n## Answer\n| a | b |\n![s](/etc/passwd)'")
WINNER = Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41})
BASELINE = Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52})
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "h4", "p",
                "section", "table", "thead", "tbody", "tr", "th", "td", "ul", "li", "strong",
                "code", "pre", "a", "img"}


class Page(html.parser.HTMLParser):
    """Every start tag and attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def assert_inert(page: str) -> None:
    """Only the report's own markup: no script, no handler, safe links, embedded images."""
    p = Page()
    p.feed(page)
    assert {t for t, _ in p.tags} <= ALLOWED_TAGS, {t for t, _ in p.tags} - ALLOWED_TAGS
    for tag, attrs in p.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        if tag == "a":
            assert safe_href(attrs["href"] or ""), attrs
        if tag == "img":
            assert (attrs["src"] or "").startswith("data:image/png;base64,"), attrs
    csp = [a for t, a in p.tags if t == "meta" and a.get("http-equiv") ==
           "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]
    assert "<script" not in page.lower() and "javascript:alert" not in page.replace(
        "(javascript:alert", "")


def test_to_html_escapes_every_field_and_keeps_only_its_own_images(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "ok.png").write_bytes(b"\x89PNG fake")
    (tmp_path / "secret.txt").write_text("TOP-SECRET")
    md = "\n".join([
        f"# {HOSTILE}", f"## {HOSTILE}", f"- {HOSTILE}", HOSTILE, f"`{HOSTILE}`",
        f"| h | {HOSTILE.splitlines()[0]} |", "|---|---|", f"| {HOSTILE.splitlines()[0]} | x |",
        "![fig](plots/ok.png)", "![leak](secret.txt)", "![up](plots/../secret.txt)",
        "![abs](/etc/hostname)", '![q" onerror="alert(4)](plots/ok.png)',
        "[a](javascript:alert(5)) [b](JaVaScRiPt:alert(6)) [c](data:text/html,x) "
        "[d](//evil.example/x) [e](vbscript:x) [ok](#/experiments/1) [web](https://x.org/a?b=1&c=2)",
        "```", "</code></pre><script>alert(7)</script>", "```"])
    page = to_html(md, tmp_path, HOSTILE)
    assert_inert(page)
    assert "TOP-SECRET" not in page and page.count("data:image/png;base64,") == 2
    assert "(figure left out: leak)" in page
    assert '<a href="https://x.org/a?b=1&amp;c=2">web</a>' in page
    assert '<a href="#/experiments/1">ok</a>' in page
    assert "&lt;script&gt;" in page and "&quot;" in page
    assert inline('a"b\'c') == "a&quot;b&#x27;c"


def test_the_note_is_inert_markdown() -> None:
    note = note_markdown(f"Train with **{HOSTILE}** [r](#/experiments/1) [x](javascript:y)")
    assert "<" not in note and ">" not in note
    assert "](javascript:" not in note and "[r](#/experiments/1)" in note


def test_a_recorded_config_is_rebuilt_only_through_an_allowed_task(tmp_path: Path) -> None:
    marker = tmp_path / "opened"
    planted = {"task": {"_target_": "builtins.open", "file": str(marker), "mode": "w"}}
    fp = fingerprint(to_run_config(planted))  # the planter sets a matching tag
    with pytest.raises(Untrusted, match=r"task._target_='builtins.open' is not allow-listed"):
        trusted_config(planted, fp, BUILTIN_TASKS)
    nested = {"data": {"_target_": "builtins.open", "file": str(marker)}}
    with pytest.raises(Untrusted, match=r"config.yaml holds data._target_"):
        trusted_config(nested, "x", BUILTIN_TASKS)
    cfg = run_config(WINNER, 0, tmp_path)
    raw = yaml.safe_load(yaml.safe_dump(flatten_to_yaml(cfg)))
    assert trusted_config(raw, fingerprint(cfg), BUILTIN_TASKS) is not None
    raw["train"]["lr"] = 0.5
    with pytest.raises(Untrusted, match="does not match the run's fingerprint tag"):
        trusted_config(raw, fingerprint(cfg), BUILTIN_TASKS)
    assert allowed_tasks("my_task.MyTask")[-1] == "my_task.MyTask"
    assert not marker.exists()


def _own_yaml(**task_options: object) -> dict:
    """The default run's config.yaml, as written, with ``task_options`` added to its task."""
    from stability.core.config import to_yaml_dict
    raw = yaml.safe_load(yaml.safe_dump(to_yaml_dict(to_run_config({}))))
    raw["task"].update(task_options)
    return raw


def test_a_recorded_config_with_an_interpolation_is_refused_and_never_resolved(
        tmp_path: Path) -> None:
    """Issue 31 A: ``${oc.create:...}`` in a task option, with a matching fingerprint tag, made
    ``build_task`` (Hydra's recursive instantiate) open a file. Now trust refuses it and
    ``build_task`` alone resolves nothing."""
    from stability.core.batches import task_of
    marker = tmp_path / "opened"
    evil = f"${{oc.create:'{{_target_: builtins.open, file: {marker}, mode: w}}'}}"
    raw = _own_yaml(evil=evil)
    fp = fingerprint(to_run_config(raw))  # the planter sets a matching tag
    with pytest.raises(Untrusted, match=r"interpolation at 'task.evil'"):
        trusted_config(raw, fp, BUILTIN_TASKS)
    with pytest.raises(ConfigError, match="unexpected keyword argument 'evil'"):
        task_of(to_run_config(raw))  # even past the trust check: a string, not a build
    assert not marker.exists()
    for planted, where in (
            ({"data": {"seed": "${oc.env:HOME}"}}, "data.seed"),
            ({"model": {"cell": ["gru", {"x": "a${model.cell}"}]}}, r"model.cell\[1\].x"),
            ({"train": {"${oc.create:x}": 1}}, r"train.\$\{oc.create:x\}"),
            ({"task": {**_own_yaml()["task"], "data": "${model}"}}, "task.data")):
        with pytest.raises(Untrusted, match=rf"interpolation at '{where}'"):
            trusted_config({**_own_yaml(), **planted}, "x", BUILTIN_TASKS)
    for key in ("_target_", "_partial_", "_args_", "_recursive_", "_convert_"):
        for planted, where in (({"task": {**_own_yaml()["task"], key: False}}, f"task.{key}"),
                               ({"model": {"cell": [{key: "os.system"}]}},
                                rf"model.cell\[0\].{key}")):
            if where == "task._target_":
                continue  # the task's own target: allow-listed by value above
            with pytest.raises(Untrusted, match=rf"config.yaml holds {where}"):
                trusted_config({**_own_yaml(), **planted}, "x", BUILTIN_TASKS)
    own = _own_yaml()
    assert own["task"]["data"] == "${data}"  # our own interpolation stays readable
    assert trusted_config(own, fingerprint(to_run_config(own)), BUILTIN_TASKS) is not None


def test_a_recorded_size_is_capped_and_the_model_is_sized_on_meta_first() -> None:
    """Issue 31 J: ``model.hidden_size=200000`` or ``data.num_samples=2e9`` passed the trust
    check and the report would have built them. Now a size over the cap refuses the seed with
    one line, and a model whose checkpoint does not fit is refused before anything real is
    allocated (built on ``meta`` only)."""
    from stability.report.evidence.trust import MAX_DATA_ELEMENTS, MAX_RECORDED_SIZE
    from stability.report.sealed.evaluate import rebuild_model
    from stability.report.sealed.rebuild import CheckpointMismatch, fitted
    from stability.tasks.sign_sum import ModelConfig, SequenceClassifier

    for section, key, value in (("data", "num_samples", 2_000_000_000),
                                ("model", "hidden_size", MAX_RECORDED_SIZE + 1),
                                ("data", "seq_len", 2e9), ("model", "hidden_size", math.inf)):
        raw = _own_yaml()
        raw[section][key] = value
        with pytest.raises(Untrusted, match=rf"^{section}.{key}={value!r} is over the report's "
                                            rf"cap: allowed values are at most 1,000,000"):
            trusted_config(raw, "x", BUILTIN_TASKS)
    raw = _own_yaml()
    raw["data"] |= {"num_samples": 200_000, "seq_len": 1_000, "seed": 10**12}  # a seed sizes
    with pytest.raises(Untrusted, match=rf"at most {MAX_DATA_ELEMENTS:,} elements"):
        trusted_config(raw, "x", BUILTIN_TASKS)
    small = SequenceClassifier(ModelConfig(hidden_size=8)).state_dict()
    built: list[str] = []

    def make() -> torch.nn.Module:
        built.append(str(torch.empty(()).device))  # where this build allocates
        return SequenceClassifier(ModelConfig(hidden_size=200_000))  # 160 GB for real

    with pytest.raises(CheckpointMismatch, match=r"best.pt does not fit the model its "
                       r"config.yaml builds \(other shapes: head.weight \(1, 8\) for "
                       r"\(1, 200000\)"):
        fitted(make, small)
    assert built == ["meta"]
    raw = _own_yaml()
    raw["model"]["hidden_size"] = 200_000
    cfg = trusted_config(raw, fingerprint(to_run_config(raw)), BUILTIN_TASKS)  # under the cap
    with pytest.raises(CheckpointMismatch, match="does not fit"):
        rebuild_model(cfg, small)
    with pytest.raises(CheckpointMismatch, match=r"missing: head.bias, head.weight, rnn.bias_hh"
                       r"_l0 \(\+3 more\); unexpected: evil"):
        fitted(lambda: SequenceClassifier(ModelConfig(hidden_size=8)), {"evil": torch.ones(1)})
    with pytest.raises(CheckpointMismatch, match="best.pt is a list, not a state_dict"):
        fitted(lambda: SequenceClassifier(ModelConfig(hidden_size=8)), [small])
    model = fitted(lambda: SequenceClassifier(ModelConfig(hidden_size=8)), small)
    assert torch.equal(model.head.weight, small["head.weight"])


def test_existing_stores_keep_their_fingerprints() -> None:
    """config.yaml lost its tracking section; old files with one still match their tags."""
    old = {"precision": {"name": "fp16"}, "clip": {"enabled": True, "max_norm": 5.0},
           "train": {"accum_steps": 4},
           "tracking": {"uri": "http://alice:pw@h:5000", "experiment": "x", "sweep_id": "s1"}}
    # values computed by main at 645850a, before issue 19
    assert fingerprint(to_run_config({})) == "0f7301c49a29"
    assert fingerprint(to_run_config(old)) == "48e72749813f"
    assert trusted_config(old, "48e72749813f", BUILTIN_TASKS).tracking.sweep_id == "s1"


def flatten_to_yaml(cfg):  # noqa: ANN001, ANN201 - config.yaml as the run writes it
    from stability.core.config import to_yaml_dict
    return to_yaml_dict(cfg)


def test_names_read_back_are_checked(tmp_path: Path) -> None:
    for bad in ("../x", "a/b", ".", "x'y", "a b"):
        with pytest.raises(ConfigError, match="sweep_id="):
            ReportConfig(sweep_id=bad)
    with pytest.raises(ConfigError, match="registry.model_name="):
        ReportConfig(model_name="m' or name='x")
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "names", "ok", [BASELINE], tmp_path)
    c = MlflowClient(uri)  # re-tagged by a teammate
    for r in c.search_runs([c.get_experiment_by_name("names").experiment_id]):
        c.set_tag(r.info.run_id, Tag.SWEEP_ID, "../../victim")
    with pytest.raises(ReportError, match=r"has the sweep id '../../victim', which is invalid"):
        build_report(ReportConfig(tracking_uri=uri, experiment="names", device="cpu",
                                  output_dir=str(tmp_path / "reports"), register=False,
                                  plots=False))
    assert not (tmp_path / "victim").exists()


def _hostile_run(c: MlflowClient, exp_id: str, sweep_id: str, parent: str, seed: int,
                 root: Path, hostile: str = HOSTILE) -> str:
    """A finished run whose name, tags and params carry markup (written by a teammate)."""
    cfg = run_config(Spec(precision="fp32", clip=None, accum=1, losses={seed: 0.1}), seed,
                     root / f"h{seed}", sweep_id,
                     parent)
    params = {k: str(v) for k, v in flatten(cfg).items() if k != "output_dir"}
    params["precision.name"] = hostile
    run = c.create_run(exp_id, run_name=hostile, tags={
        Tag.KIND: "train", Tag.SWEEP_ID: sweep_id, Tag.FINGERPRINT: hostile,
        Tag.SEED: str(seed), Tag.OUTCOME: "finished", Tag.REASON: hostile,
        Tag.PARENT_RUN_ID: parent})
    rid = run.info.run_id
    c.log_batch(rid, params=[Param(k, v[:6000]) for k, v in params.items()][:100])
    ts = int(time.time() * 1000)
    c.log_batch(rid, metrics=[Metric(k, v, ts, 0) for k, v in
                              {"best_val_loss": 0.1 + 0.01 * seed, "best_epoch": 2.0,
                               "clip_fraction": 0.0, "skip_count": 0.0}.items()])
    c.set_terminated(rid)
    return rid


@pytest.mark.slow
def test_a_planted_sweep_is_reported_escaped_contained_and_complete(tmp_path: Path) -> None:
    """Hostile winner label/tags, a planted config.yaml, a bad steps.csv cell, a planted file
    and a link in the report folder: the report ends 0, inert, uploading only its own files."""
    uri, sweep = sqlite_store(tmp_path / "mlflow.db"), "planted"
    ids = make_sweep(uri, "planted", sweep, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("planted").experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    hostile = [_hostile_run(c, exp_id, sweep, parent, s, tmp_path) for s in (0, 1)]
    # a planted config.yaml on the hostile winner's first seed: built, it would open a file
    marker = tmp_path / "opened"
    planted = tmp_path / "plant" / CONFIG_NAME
    planted.parent.mkdir()
    planted.write_text(yaml.safe_dump({"task": {"_target_": "builtins.open",
                                                "file": str(marker), "mode": "w"}}))
    c.log_artifact(hostile[0], str(planted))
    weights = next((tmp_path / "runs").glob(f"*/{CHECKPOINT_NAME}"))
    c.log_artifact(hostile[0], str(weights), "checkpoints")
    # one baseline run's steps.csv with a word where a number belongs
    bad = tmp_path / "bad" / CSV_NAME
    bad.parent.mkdir()
    good = (tmp_path / "runs").glob(f"{sweep}-fp32-None-1-30-0.002-0/{CSV_NAME}")
    lines = next(good).read_text().splitlines()
    header = lines[0].split(",")
    row = lines[2].split(",")
    row[header.index("skipped")] = "abc"
    bad.write_text("\n".join([lines[0], lines[1], ",".join(row), *lines[3:]]) + "\n")
    baseline_run = ids[(fingerprint(run_config(BASELINE, 0, Path("."))), 0)]
    c.log_artifact(baseline_run, str(bad))
    # the report folder already holds a private file and a link to a file outside
    out = tmp_path / "reports"
    (out / sweep).mkdir(parents=True)
    (out / sweep / "id_rsa").write_text("PRIVATE KEY")
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (out / sweep / "report.md").symlink_to(victim)

    result = build_report(ReportConfig(tracking_uri=uri, experiment="planted", sweep_id=sweep,
                                       output_dir=str(out), device="cpu", register=False,
                                       plots=False))
    assert not marker.exists()
    assert victim.read_text() == "untouched"
    md = (out / sweep / "report.md")
    assert not md.is_symlink()
    text = md.read_text()
    assert f"run {baseline_run} is unreadable" in text
    assert "steps.csv line 3, column skipped: 'abc' is not a number" in text
    assert "task._target_='builtins.open' is not allow-listed" in text
    assert "Traceback" not in text
    page = (out / sweep / "report.html").read_text()
    assert_inert(page)
    assert "&lt;script&gt;" in page  # the label is there, as text
    names = {a.path for a in c.list_artifacts(result.report_run_id)}
    assert names == {"report.md", "report.html", "summary.csv"}
    assert (out / sweep / "id_rsa").read_text() == "PRIVATE KEY"  # left alone, not uploaded
    note = c.get_run(parent).data.tags[Tag.NOTE]
    assert "<" not in note.replace("&lt;", "") and "](javascript:" not in note
    assert [p for p in (out / sweep).iterdir() if p.name.startswith(".staging")] == []


def test_a_linked_report_folder_is_refused(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlflow.db")
    make_sweep(uri, "linked", "lk", [BASELINE], tmp_path / "runs")
    (tmp_path / "reports").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "reports" / "lk").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ReportError, match="is a link or leads outside it"):
        build_report(ReportConfig(tracking_uri=uri, experiment="linked", device="cpu",
                                  output_dir=str(tmp_path / "reports"), register=False,
                                  plots=False))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_recorded_optimizer_or_schedule_must_be_pytorchs_own() -> None:
    """optim/schedule _target_ may name torch.optim classes or the built-in schedules only."""
    sgd = {"optim": {"_target_": "torch.optim.SGD", "_partial_": True, "momentum": 0.9},
           "schedule": {"_target_": "stability.core.optim.warmup_cosine", "warmup_steps": 5}}
    cfg = trusted_config(sgd, fingerprint(to_run_config(sgd)), BUILTIN_TASKS)
    assert cfg.optim.target == "torch.optim.SGD"
    for planted, key in (({"optim": {"_target_": "os.system", "_partial_": True}}, "optim"),
                         ({"schedule": {"_target_": "builtins.exec"}}, "schedule"),
                         ({"schedule": {"_target_": "torch.optim.lr_scheduler.os.system"}},
                          "schedule")):
        with pytest.raises(Untrusted, match=rf"{key}._target_=.* is not allow-listed"):
            trusted_config(planted, "x", BUILTIN_TASKS)


BREAKOUT = "fp32` [x](/etc/passwd) ![i](http://evil/x.png) `"


def test_inert_text_cannot_close_a_code_span_or_make_a_link_or_an_image() -> None:
    from stability.report.evidence.inert import inert
    for rendered in (inline(f"`{inert(BREAKOUT)}`"), inline(inert(BREAKOUT))):
        assert "<a " not in rendered and "<img" not in rendered, rendered
    note = note_markdown(f"winner `{inert(BREAKOUT)}`")
    assert "](" not in note and "![" not in note and note.count("`") == 2


@pytest.mark.slow
def test_a_backtick_in_a_value_makes_no_link_and_no_image(tmp_path: Path) -> None:
    """Issue 31 K: a backtick in a param value closed the code span of its label; report.html
    then held a link to /etc/passwd and MLflow's note a remote image. Now both are text."""
    uri, sweep = sqlite_store(tmp_path / "mlflow.db"), "k"
    make_sweep(uri, "k", sweep, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("k").experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    for s in (0, 1):  # the winner: its label reaches the answer, the tables and the note
        _hostile_run(c, exp_id, sweep, parent, s, tmp_path, BREAKOUT)
    out = tmp_path / "reports"
    build_report(ReportConfig(tracking_uri=uri, experiment="k", sweep_id=sweep,
                              output_dir=str(out), device="cpu", register=False, plots=False))
    md = (out / sweep / "report.md").read_text()
    assert "/etc/passwd" in md and "](/etc/passwd)" not in md and "![i](" not in md
    page = (out / sweep / "report.html").read_text()
    p = Page()
    p.feed(page)
    assert [a for t, a in p.tags if t == "a" and "passwd" in (a.get("href") or "")] == []
    assert [a for t, a in p.tags if t == "img"] == []  # plots=False: no image at all
    assert_inert(page)
    note = c.get_run(parent).data.tags[Tag.NOTE]
    assert "/etc/passwd" in note and "](/etc/passwd)" not in note and "![i](" not in note


@pytest.mark.slow
def test_a_planted_finished_run_is_unreadable_and_other_users_runs_are_named(
        tmp_path: Path) -> None:
    """G, the report: a FINISHED run planted for a point the sweep never ran (adopted by its
    parent, best_val_loss 0.0001, no artifacts, created by another MLflow user) is one
    unreadable run named with its reason, not the winner; the page names it among the runs
    another user created, escaped."""
    import json

    uri, sweep = sqlite_store(tmp_path / "mlflow.db"), "g31"
    make_sweep(uri, "g31", sweep, [WINNER, BASELINE], tmp_path / "runs")
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("g31").experiment_id
    parent = c.search_runs([exp_id], "tags.`stability.kind` = 'sweep'")[0].info.run_id
    other = Spec(precision="fp16", clip=5.0, accum=1, losses={0: 0.0001})
    user = "mallory<b>`](x)"
    planted = c.create_run(exp_id, tags={
        Tag.KIND: "train", Tag.FINGERPRINT: fingerprint(run_config(other, 0, tmp_path)),
        Tag.SEED: "0", Tag.OUTCOME: "finished", "mlflow.user": user}).info.run_id
    c.log_metric(planted, "best_val_loss", 0.0001)
    c.set_terminated(planted)
    listing = tmp_path / "adopted" / "adopted_runs.json"
    listing.parent.mkdir()
    listing.write_text(json.dumps([planted]))
    c.log_artifact(parent, str(listing))

    result = build_report(ReportConfig(tracking_uri=uri, experiment="g31", sweep_id=sweep,
                                       output_dir=str(tmp_path / "out"), device="cpu",
                                       register=False, plots=False))
    assert result.winner == fingerprint(run_config(WINNER, 0, tmp_path))
    text = (tmp_path / "out" / sweep / "report.md").read_text()
    assert (f"run {planted} is unreadable, counted as not finished: unreadable run: it has no "
            "config.yaml") in text
    assert (f"1 of the sweep's 5 runs were created by another MLflow user than the sweep's "
            f"(unknown): {planted} (mallory") in text
    page = (tmp_path / "out" / sweep / "report.html").read_text()
    assert_inert(page)
    assert "mallory&lt;b&gt;" in page and "mallory<b>" not in page
