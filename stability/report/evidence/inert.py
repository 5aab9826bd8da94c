"""A string read from a run, made inert: text that no markdown renderer turns into markup.

Applied where a run's strings enter the report (``fetch``, ``adoption``, ``check_runs``...)
and to every note and reason line, so it lives below every stage that reads runs; ``html``
builds the page on the same rule.
"""

from __future__ import annotations

# What lets text become markdown markup, and its inert look-alike: a backtick closes a code
# span (U+02CB looks the same and is no markup), ``](`` makes a link and ``![`` an image.
_ACTIVE = (("`", "\u02cb"), ("](", "] ("), ("![", "! ["))


def inert(value: str) -> str:
    """``value`` (read from a run) as text no markdown renderer turns into markup.

    Applied where a run's strings enter the report (``fetch``) and to every note and reason
    line: inside a code span or not, it cannot close the span, make a link or an image, in
    report.html or in MLflow's own renderer (``mlflow.note.content``).
    """
    for active, text in _ACTIVE:
        value = value.replace(active, text)
    return value


def one_line(value: str) -> str:
    """A string read from a run as one inert line (no control character, no markup)."""
    return inert("".join(ch if ch.isprintable() else " " for ch in value))
