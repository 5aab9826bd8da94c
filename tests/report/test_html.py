"""report.html: one self-contained page, answer first, figures embedded, text escaped."""

from __future__ import annotations

import base64
import re

from stability.report.present.html import inline, to_html

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")

MD = """# Report `s1`

Intro line.

## Answer

**Train with `fp32 noclip acc=1`** (x < y).
- a verdict with [a link](#/experiments/1/runs/abc)

## Table

| a | b \\| c |
|---|---|
| 1 | `x\\|y` |

## Figures

![Heatmap](plots/heatmap.png)

```bash
python experiments/report.py sweep_id=s1
```
"""


def test_the_page_is_self_contained_with_the_answer_first(tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "heatmap.png").write_bytes(PNG)
    page = to_html(MD, tmp_path, "t")
    assert page.startswith("<!DOCTYPE html>")
    answer = re.search(r'<section id="answer">(.*?)</section>', page, re.S)
    assert answer is not None and page.index('id="answer"') < page.index("<table>")
    assert "<strong>Train with <code>fp32 noclip acc=1</code></strong> (x &lt; y)." in answer[1]
    assert '<a href="#/experiments/1/runs/abc">a link</a>' in answer[1]
    assert f'src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in page
    assert "plots/heatmap.png" not in page  # nothing to fetch beside the page
    assert "<th>b | c</th>" in page and "<td>1</td>" in page
    assert "<td><code>x|y</code></td>" in page  # write.py escapes a cell's pipes
    assert "<pre><code>python experiments/report.py sweep_id=s1</code></pre>" in page
    assert not re.search(r'<(script|link)\b|src="http', page)


def test_inline_markup_escapes_html_and_leaves_code_alone():
    assert inline("<b>") == "&lt;b&gt;"
    assert inline("`**x**`") == "<code>**x**</code>"


def test_the_report_names_in_the_contract_are_documented():
    from pathlib import Path

    from stability.tracking.contract import Artifact, Tag

    doc = (Path(__file__).resolve().parents[2] / "docs" / "TRACKING.md").read_text()
    names = [Tag.NOTE, Tag.REPORT_RUN_ID, Tag.WINNER_STABILITY, Tag.MAX_NORM_RECOMMENDATION,
             Tag.MODEL_URI, Artifact.REPORT_MD, Artifact.REPORT_HTML, Artifact.SUMMARY_CSV,
             Artifact.LAYER_NORMS_FIGURE]
    assert [n for n in names if f"`{n}`" not in doc] == []
    assert f"named\n  `{Artifact.MODEL}`" in doc or f"named `{Artifact.MODEL}`" in doc


def test_a_long_table_is_folded_but_never_the_answers(tmp_path):
    """Issue 49: the 48-row ranked table folds; the answer's 11-row table stays on screen."""
    rows = "\n".join(f"| {i} | x |" for i in range(11))
    md = f"## Answer\n\n| a | b |\n|---|---|\n{rows}\n\n## Detail\n\n| a | b |\n|---|---|\n{rows}\n"
    page = to_html(md, tmp_path, "t")
    answer, detail = page.split("<h2>Detail</h2>")
    assert "<details>" not in answer and "<table>" in answer
    fold = "<details><summary>the table's 11 rows (click to open)</summary><table>"
    assert detail.count(fold) == 1
