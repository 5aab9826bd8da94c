"""The answer where MLflow's UI shows it without a click: the report run's and the experiment's
descriptions (``mlflow.note.content``), and the experiment's kind.

MLflow 3's UI opens an experiment tagged ``mlflow.experimentKind=custom_model_development``
(``Tag.EXPERIMENT_KIND``) on its runs table, with the experiment's description folded to its
first line above it: ``## Train with `<config>` ``. The report run's page shows the answer's
first screen (the answer table in it). A description someone else wrote is kept.
Best effort, as the sweep's parent run note (``publish.annotate_parent``): the report is
complete and logged when this runs. ``tests/report/test_page.py`` opens the experiment in
Chromium on a real ``mlflow server`` and finds the answer above the runs.
"""

from __future__ import annotations

import logging
from typing import Any

from stability.report.evidence.fetch import Sweep
from stability.report.present.html import note_markdown
from stability.report.publish.publish import MAX_TAG
from stability.tracking.contract import Artifact, Tag
from stability.tracking.uri import mark_training_experiment

log = logging.getLogger(__name__)

EXPERIMENT_NOTE_HEAD = "## Train with `"  # how our experiment description starts


def describe_report_run(c: Any, sweep: Sweep, run_id: str, label: str, answer: str) -> None:
    """The answer where MLflow's UI shows it without a click; best effort.

    The report run's description (``mlflow.note.content``) is the answer's first screen (the
    answer table in it). The experiment is marked as model training (its UI opens on the runs)
    and its description, shown above the runs table (folded to its first line, which names the
    chosen config), becomes the latest report's answer with a link to the report run, unless
    someone else wrote that description (then it is kept).
    """
    note = note_markdown(answer)
    if len(note) > MAX_TAG:
        note = note[:MAX_TAG - 60].rsplit("\n", 1)[0] + "\n\n…(cut: see report.html)"
    link = f"#/experiments/{sweep.experiment_id}/runs/{run_id}"
    head = (f"{EXPERIMENT_NOTE_HEAD}{note_markdown(label)}`\n\nThe latest stability report, "
            f"sweep `{sweep.sweep_id}`: [report run]({link}) · "
            f"[report.html]({link}/artifactPath/{Artifact.REPORT_HTML})\n\n")
    try:
        c.set_tag(run_id, Tag.NOTE, note)
        mark_training_experiment(c, sweep.experiment_id)
        own = (c.get_experiment(sweep.experiment_id).tags or {}).get(Tag.NOTE, "")
        if not own.strip() or own.startswith(EXPERIMENT_NOTE_HEAD):
            c.set_experiment_tag(sweep.experiment_id, Tag.NOTE, (head + note)[:MAX_TAG])
    except Exception:  # the report stands without its description
        log.exception("could not describe the report run %s", run_id)
