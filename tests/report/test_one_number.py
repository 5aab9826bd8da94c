"""One number per idea (issue 59, items 1, 3 and 5): a rendered study prints every repeated
quantity with one value and one format in every section, and calls its configs by one name.

A 12-config fixture sweep (2 precisions x clip off / 1 / 5 x accum 1 / 2, three seeds) is
reported into a SQLite store, then report.md is read back as a reviewer reads it: each level's
training time, CI and verdict in the answer table against the factor table and the factor
sentences; the margin in the answer, the guarantee, the factor table's method and the
main-effects caption; the sealed test's accuracy in the answer and in the test table; and the
words: "chosen" and "lowest mean", never "winner" or "best so far".
"""

from __future__ import annotations

import re

import pytest

from stability.report import ReportConfig, build_report
from stability.report.present.answer_table import HEADER
from tests.helpers.report_fixtures import Spec, make_sweep
from tests.helpers.stores import sqlite_store

pytestmark = pytest.mark.slow


def _specs() -> list[Spec]:
    out = []
    for i, (precision, clip, accum) in enumerate(
            (p, c, a) for p in ("fp32", "bf16") for c in (None, 1.0, 5.0) for a in (1, 2)):
        low = 0.395 if (precision, clip, accum) == ("bf16", 5.0, 2) else 0.40 + 0.0005 * (i % 3)
        out.append(Spec(precision=precision, clip=clip, accum=accum,
                        losses={0: low, 1: low + 0.004, 2: low + 0.002 + 0.001 * (i % 2)}))
    return out


@pytest.fixture(scope="module")
def md(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("one-number")
    uri = sqlite_store(root / "mlflow.db")
    make_sweep(uri, "one", "one-1", _specs(), root)
    out = build_report(ReportConfig(tracking_uri=uri, experiment="one", device="cpu",
                                    output_dir=str(root / "reports"), register=False))
    return (out.folder / "report.md").read_text()


def _table_after(md: str, marker: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``marker`` (header first)."""
    lines = md.split(marker, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def test_every_repeated_number_has_one_value_across_sections(md: str) -> None:
    answer = _table_after(md, "**Train with")
    assert answer[0] == HEADER
    factor_rows = _table_after(md, "## Factor effects")
    head = factor_rows[0]
    by_contrast = {r[head.index("contrast")].split(" vs ")[0]: r for r in factor_rows[1:]}
    sentences = md.split("What each setting does", 1)[1].split("\n\n", 2)[1]
    compared = 0
    for row in answer[1:]:
        level = row[1].removeprefix("→ ")
        if level not in by_contrast:
            continue  # the reference: "reference", 1.00×
        f = by_contrast[level]
        ci = f"{f[head.index('effect')]} {f[head.index('95% t CI (per contrast)')]}"
        assert row[HEADER.index("vs reference [95% t CI]")] == ci, (level, row, f)
        assert row[HEADER.index("verdict (Holm)")] == f[head.index("verdict (Holm)")]
        time = row[HEADER.index("time × reference")].lstrip("≈")
        assert time == f[head.index("training time ×")], (level, row, f)
        # the factor sentence quotes the same time: "<level> **verdict** ...; 1.02× the ..."
        said = re.search(re.escape(level) + r" \*\*[a-z]+\*\*.*?; ([0-9.]+×) the training time",
                         sentences)
        assert said is not None and said.group(1) == time, (level, sentences)
        compared += 1
    assert compared == 4  # max_norm 1, max_norm 5, accum 2, bf16

    margin = re.search(r"margin (\d\.\d{4}) \(5% of the lowest config mean", md).group(1)
    assert f"within {margin} of the best level" in md  # the guarantee
    assert f"TOST against ±{margin} (report.margin)" in md  # the factor table's method
    assert f"the equivalence margin ±{margin};" in md  # the main-effects caption
    assert f"margin {margin}):" in md  # the factor sentences' heading

    accuracy = re.search(r"accuracy (\d\.\d{3} ± \d\.\d{3}) over", md).group(1)
    test = _table_after(md, "## Test evaluation (chosen config only)")
    mean = next(r for r in test if r[0].startswith("mean ± std"))
    assert mean[3] == accuracy and all(len(r[3].split(".")[-1]) == 3 for r in test[1:-1])


def test_one_name_for_the_chosen_config_and_one_for_the_lowest_mean(md: str) -> None:
    assert "winner" not in md.lower() and "best so far" not in md
    assert "## Test evaluation (chosen config only)" in md
    assert "Stability: The chosen config is " in md
    assert "lowest mean (rank 1) = lowest mean best_val_loss" in md
    # "How sure": the chosen config against bf16 clip=5 acc=2, rank 1, by its one name
    assert "| chosen vs lowest mean | " in md and "`bf16 clip=5 acc=2` (rank 1)" in md


def test_one_format_per_column(md: str) -> None:
    assert not re.search(r"\d\.\d+e-\d\d", md)  # no scientific notation anywhere
    ranked = _table_after(md, "## All configs, ranked")
    col = ranked[0].index("clipped (% of steps)")
    assert all(re.fullmatch(r"\d+%", r[col]) for r in ranked[1:])
    factor_rows = _table_after(md, "## Factor effects")
    for name in ("p", "Holm p"):
        col = factor_rows[0].index(name)
        assert all(re.fullmatch(r"<0\.0001|[01](\.\d+)?|\d\.\d+e?", r[col])
                   for r in factor_rows[1:]), [r[col] for r in factor_rows[1:]]
