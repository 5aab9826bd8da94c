"""The page a reviewer reads (issue 49): report.html rendered by headless Chromium at 1280 px.

A 12-config fixture sweep (2 precisions x clip off / 1 / 5 x accum 1 / 2, two seeds) whose
lowest validation mean is not the decision's choice is reported into a SQLite store; Chromium
(``tests/helpers/page.py``) then measures the page: no horizontal overflow of the page or of
any table, the answer first and the main-effects figure within the first 1,500 px, alt text on
every image. The Markdown and MLflow sides are checked on the same report: the ranked table in
validation-mean order with the chosen row marked, the report run's description is the answer,
the experiment opens on its runs in MLflow's UI (``mlflow.experimentKind``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.report import ReportConfig, build_report
from stability.tracking.contract import EXPERIMENT_KIND_TRAINING, UI_TRAINING_VIEW, Tag
from tests.helpers.page import measure
from tests.helpers.report_fixtures import Spec, make_sweep
from tests.helpers.stores import sqlite_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WIDTH, FIRST_FIGURE_PX = 1280, 1500


def _specs() -> list[Spec]:
    """Every config near 0.40; bf16 clip=5 acc=2 has the lowest mean by less than the margin."""
    out = []
    for i, (precision, clip, accum) in enumerate(
            (p, c, a) for p in ("fp32", "bf16") for c in (None, 1.0, 5.0) for a in (1, 2)):
        low = 0.395 if (precision, clip, accum) == ("bf16", 5.0, 2) else 0.40 + 0.0005 * (i % 3)
        out.append(Spec(precision=precision, clip=clip, accum=accum,
                        losses={0: low, 1: low + 0.004}))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    uri = sqlite_store(root / "mlflow.db")
    make_sweep(uri, "page", "page-1", _specs(), root)
    out = build_report(ReportConfig(tracking_uri=uri, experiment="page", device="cpu",
                                    output_dir=str(root / "reports"), register=False))
    return uri, out


def test_the_first_screen_shows_the_answer_and_why_without_overflow(report):
    assert Path(CHROMIUM).exists(), "install Chromium: apt-get install chromium (make setup-dev)"
    _, out = report
    shots = os.environ.get("STABILITY_SCREENSHOT_DIR")
    page = measure((out.folder / "report.html").resolve().as_uri(), WIDTH,
                   Path(shots) / "report-page" if shots else None)
    assert page["scroll_width"] <= page["page_width"], page  # no horizontal scroll at 1280 px
    for t in page["tables"]:  # no table wider than the page, nor scrolling inside itself
        assert t["scroll"] <= t["client"] + 1 and t["width"] <= page["body_width"], t
    assert page["answer_px"] is not None and page["answer_px"] < 300, page
    assert page["tables"][0]["open"]  # the answer's table is never folded
    assert any(t["rows"] == 13 and not t["open"] for t in page["tables"])  # the ranked, folded
    assert page["first_figure_px"] < FIRST_FIGURE_PX, page
    assert page["first_figure_alt"].startswith("Main effects"), page
    assert page["images"] >= 3 and page["images_without_alt"] == 0, page


def test_the_ranked_table_reads_in_rank_order_with_the_chosen_row_marked(report):
    _, out = report
    md = (out.folder / "report.md").read_text()
    section = md.split("## All configs, ranked", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if re.match(r"\| \d+ \|", r)]
    assert [int(r.split("|")[1]) for r in rows] == list(range(1, len(rows) + 1))
    marked = [r for r in rows if "→ chosen" in r]
    assert len(marked) == 1 and f"`{out.winner_label}`" in marked[0]
    assert "red box: winner" not in md and "winner:" not in md.split("## Figures", 1)[1]


def test_mlflow_opens_on_the_runs_with_the_answer_as_the_report_runs_description(report):
    uri, out = report
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("page")
    assert exp.tags[Tag.EXPERIMENT_KIND] == EXPERIMENT_KIND_TRAINING
    note = c.get_run(out.report_run_id).data.tags[Tag.NOTE]
    assert f"**Train with `{out.winner_label}`**" in note and "| factor | level |" in note
    described = exp.tags[Tag.NOTE]  # the experiment page shows it above the runs table
    assert described.startswith(f"## Train with `{out.winner_label}`\n\nThe latest stability "
                                "report, sweep `page-1`: [report run](")
    assert note in described and out.report_run_id in described


@pytest.mark.server
def test_the_mlflow_ui_opens_the_experiment_on_its_runs_with_the_answer(mlflow_server, tmp_path):
    """The sweep's view link (``?workflowType=machine_learning``) shows the runs table, and the
    experiment's description above it names the chosen config: no click needed."""
    from tests.report.test_browser import open_and_read

    uri = mlflow_server.uri
    make_sweep(uri, "page-ui", "ui-1",
               [Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41}),
                Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52})], tmp_path)
    out = build_report(ReportConfig(tracking_uri=uri, experiment="page-ui", device="cpu",
                                    output_dir=str(tmp_path / "reports"), register=False))
    exp_id = MlflowClient(uri).get_experiment_by_name("page-ui").experiment_id
    shots = Path(os.environ.get("STABILITY_SCREENSHOT_DIR", tmp_path))
    texts = open_and_read(f"{uri}/#/experiments/{exp_id}{UI_TRAINING_VIEW}",
                          tmp_path / "profile", f"report {out.sweep_id}",
                          shots / "mlflow-experiment-runs.png")
    page = "\n".join(texts.values())
    assert f"Train with {out.winner_label}" in page  # the description's first line
    assert f"report {out.sweep_id}" in page and "sweep ui-1" in page  # the runs table's rows


def test_the_terminal_shows_the_answer_and_the_log_file_our_info_lines(report, capsys, tmp_path):
    """``stability report`` prints the answer block and the paths; its INFO lines (and
    MLflow's) go to report.log; ``-v`` would bring them to the terminal."""
    from tests.helpers.in_process import in_process

    uri, _ = report
    done = in_process(["report", "experiment=page", f"tracking.uri={uri}", "device=cpu",
                       "registry.enabled=false", f"output_dir={tmp_path / 'r'}",
                       f"hydra.run.dir={tmp_path / 'h'}"], capsys)
    assert done.code == 0, done.stderr[-2000:]
    out = done.stdout + done.stderr
    assert "Train with `" in out and "report finished in" in out
    assert "[INFO]" not in out and "INFO mlflow" not in out, out
    log = (tmp_path / "h" / "report.log").read_text()
    assert "[stability.report.pipeline][INFO] - chosen" in log
