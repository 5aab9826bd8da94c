"""Hostile values in every field the report reads (issue 31): property-based, in-process.

Hypothesis feeds interpolations, backticks, ``](``, markup, path traversal, huge numbers and
``nan``/``inf``/``abc`` into the params and tags of a recorded run (``fetch._row`` on a real
MLflow ``Run`` entity), into a recorded ``config.yaml`` (``trust.trusted_config``), into the
labels built from them and into the report's markdown (``html.to_html``, ``note_markdown``).
Each must end in data or one refusal: no crash, no module imported, no markup from a value.
Headless Chromium renders a few such pages: no request leaves the page, no link or image but
the report's own kinds (an in-page anchor, a relative path, an embedded figure).
The real reports over a store with a fixed set of these values are in
tests/report/test_trust.py and tests/report/test_bad_runs.py.
"""

from __future__ import annotations

import base64
import contextlib
import re
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from stability.core.config import ConfigError, to_run_config, to_yaml_dict
from stability.core.identity import config_label, fingerprint
from stability.report.evidence.fetch import TYPED_PARAMS, UNREADABLE, _row
from stability.report.evidence.inert import inert
from stability.report.evidence.trust import BUILTIN_TASKS, Untrusted, trusted_config
from stability.report.present.html import inline, note_markdown, to_html
from stability.tracking.contract import Tag
from tests.report.test_bad_runs import a_run
from tests.report.test_trust import ALLOWED_TAGS, Page, assert_inert

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


# -- Chromium: the page makes no outside request and links nowhere else ------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# One pixel: a figure the report embeds (``plots/*.png`` in its folder becomes a data: URI).
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQ"
                       "DwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


class _Requests(socketserver.ThreadingTCPServer):
    """A loopback proxy that records the first line of every request and answers 404: what
    Chromium would have fetched from outside, had it been allowed to."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.seen: list[str] = []

        class Handler(socketserver.StreamRequestHandler):
            def handle(inner) -> None:  # noqa: N805 - the server's own record
                line = inner.rfile.readline(2000).decode("latin-1").strip()
                if line:
                    self.seen.append(line)
                inner.wfile.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                                  b"Connection: close\r\n\r\n")

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def proxy() -> Iterator[_Requests]:
    server = _Requests()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _render(page: Path, port: int, profile: Path) -> str:
    """The DOM headless Chromium builds from ``page``, every request it makes through the
    recording proxy (loopback included: ``<-loopback>``)."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--disable-sync", "--disable-default-apps", "--no-pings", "--disable-domain-reliability",
         f"--user-data-dir={profile}", f"--proxy-server=http://127.0.0.1:{port}",
         "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=3000", "--dump-dom",
         page.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _hostile_page(folder: Path, values: list[str]) -> Path:
    """report.html as ``to_html`` writes it from markdown holding ``values`` where a run's
    strings go (headings, list items, table cells, code spans) and one real figure."""
    (folder / "plots").mkdir(parents=True)
    (folder / "plots" / "f.png").write_bytes(PNG)
    cells = [" ".join(inert(v).replace("|", "\\|").split()) for v in values]
    md = "\n".join([f"# `{cells[0]}`", "## Answer", f"- `{cells[-1]}`: {cells[0]}", cells[-1],
                    "| a | b |", "|---|---|", f"| `{cells[0]}` | {cells[-1]} |",
                    "![figure](plots/f.png)", f"![{cells[0]}](plots/f.png)",
                    "[the answer](#answer)"])
    page = folder / "report.html"
    page.write_text(to_html(md, folder, values[0]))
    return page


REQUESTING = ["<img src=http://evil.test/a.png>", "![i](http://evil.test/b.png)",
              "<link rel=stylesheet href=//evil.test/c.css>", "[x](https://evil.test/d)",
              "<iframe src=http://evil.test/e></iframe>", "`](http://evil.test/f)"]


# Chromium's own services (its network-time and component queries) go through the proxy too;
# they are the browser's, not the page's: every other host is an outside request of the page.
BROWSER_OWN = re.compile(r"^(GET|POST|CONNECT) (https?://)?[\w.-]*\.(google\.com|gstatic\.com|"
                         r"googleapis\.com)[:/ ]")


def _outside(seen: list[str]) -> list[str]:
    return [line for line in seen if not BROWSER_OWN.match(line)]


@pytest.mark.browser
@pytest.mark.slow
@settings(max_examples=2, deadline=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(values=st.lists(HOSTILE, min_size=2, max_size=4))
def test_chromium_renders_a_hostile_page_without_an_outside_request_or_link(
        values, proxy, tmp_path_factory) -> None:
    """The page from hostile values (and every kind of outside reference), rendered by
    Chromium: no request of the page reaches the (recording) network, and the DOM holds no
    link or image but the in-page anchor and the embedded figures."""
    assert Path(CHROMIUM).exists(), "install Chromium: apt-get install chromium"
    tmp = Path(tmp_path_factory.mktemp("chromium"))
    before = len(proxy.seen)
    dom = _render(_hostile_page(tmp / "report", [*values, *REQUESTING]),
                  proxy.server_address[1], tmp / "profile")
    assert _outside(proxy.seen[before:]) == []
    page = Page()
    page.feed(dom)
    assert "body" in {t for t, _ in page.tags}
    assert {t for t, _ in page.tags} <= ALLOWED_TAGS, page.tags
    hrefs = [a.get("href") or "" for t, a in page.tags if t == "a"]
    srcs = [a.get("src") or "" for t, a in page.tags if t == "img"]
    assert hrefs == ["#answer"], hrefs
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs), srcs


@pytest.mark.browser
@pytest.mark.slow
def test_the_request_recorder_sees_a_raw_pages_requests(proxy, tmp_path: Path) -> None:
    """The control: the same outside references as raw HTML do reach the recorder, so the
    test above would see a request the page made."""
    raw = tmp_path / "raw.html"
    raw.write_text("<!doctype html><html><body>" + "".join(REQUESTING) + "</body></html>")
    _render(raw, proxy.server_address[1], tmp_path / "profile")
    assert any("evil.test" in line for line in _outside(proxy.seen)), proxy.seen
