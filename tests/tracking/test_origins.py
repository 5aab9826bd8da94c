"""Credentials go only to the configured store; nothing is read from elsewhere (issue 46, 1).

The victim has MLflow credentials exported (as for the team server) and shares an embedded
SQLite store with a hostile teammate, who plants, through the MLflow client (and, for a run's
``artifact_uri``, in the store file itself), locations on a host of their choosing: a real
listener on 127.0.0.1 that records every request. The victim's real commands run; the
listener must receive nothing.
"""

from __future__ import annotations

import http.server
import json
import sqlite3
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from stability.tracking.origins import S3_BUCKET_VAR, refusal
from tests.helpers.in_process import in_process
from tests.helpers.processes import PROJECT
from tests.helpers.report_fixtures import Spec, make_sweep
from tests.helpers.stores import sqlite_store

USER, PASSWORD = "victim", "victim-pw-46c1"
SPECS = [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52}),
         Spec(precision="bf16", clip=1.0, accum=1, losses={0: 0.40, 1: 0.41})]


class Listener(http.server.ThreadingHTTPServer):
    """The attacker's HTTP server: records each request's method, path and headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                listener.seen.append((self.command, self.path, dict(self.headers)))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _any

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def signed_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The victim's credentials, in the environment and in ``~/.mlflow/credentials``."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    home = tmp_path / "home"
    (home / ".mlflow").mkdir(parents=True)
    (home / ".mlflow" / "credentials").write_text(
        f"[mlflow]\nmlflow_tracking_username = {USER}\nmlflow_tracking_password = {PASSWORD}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.chdir(PROJECT)


def test_the_policy_allows_only_the_configured_store(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    server, db = "http://127.0.0.1:5000", f"sqlite:///{tmp_path}/mlflow.db"
    assert refusal(server, "mlflow-artifacts:/3/abc/artifacts") == ""
    assert refusal(server, "mlflow-artifacts://127.0.0.1:5000/3/abc") == ""
    assert refusal(server, "http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/x") == ""
    for elsewhere in ("mlflow-artifacts://evil:5000/3", "http://evil:5000/x",
                      "http://127.0.0.1:5001/x", "https://127.0.0.1:5000/x", "gs://b/x",
                      "ftp://evil/x", "/tmp/x", "runs:/abc/model"):
        assert refusal(server, elsewhere), elsewhere
    assert refusal(db, f"{tmp_path}/mlruns/exp/1/artifacts") == ""
    assert refusal(db, (tmp_path / "mlruns" / "exp").as_uri()) == ""
    for elsewhere in ("http://127.0.0.1:5000/x", f"{tmp_path}-other/x", "/etc", "../x"):
        assert refusal(db, elsewhere), elsewhere
    assert refusal(server, "s3://team/1/abc", root="s3://team/1") == ""
    assert refusal(server, "s3://evil/1/abc", root="s3://team/1")
    monkeypatch.setenv(S3_BUCKET_VAR, "team")
    assert refusal(server, "s3://team/9") == "" and refusal(server, "s3://evil/9")


@pytest.mark.slow
def test_a_planted_experiment_location_gets_no_request_from_a_sweep(
        tmp_path: Path, listener: Listener, signed_in: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An experiment pre-created with ``artifact_location=http://<attacker>/...``: the victim's
    sweep (and check) is refused in one line naming it, before any run; the listener got
    nothing (it got 22 authenticated requests before)."""
    uri = sqlite_store(tmp_path / "store" / "mlflow.db")
    MlflowClient(uri).create_experiment("shared", artifact_location=f"{listener.url}/loot")
    done = in_process(["sweep", "-m", "+sweep=smoke", "device=cpu", "seed=0",
                       "hydra/launcher=basic", f"tracking.uri={uri}",
                       "tracking.experiment=shared", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      capsys)
    assert done.code == 1, done.stderr[-3000:]
    assert f"experiment 'shared' keeps its artifacts at '{listener.url}/loot'" in done.stderr
    assert "Traceback" not in done.stderr
    assert listener.seen == []
    assert MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name(
        "shared").experiment_id]) == []


@pytest.mark.slow
def test_a_report_reads_nothing_a_teammate_pointed_elsewhere(
        tmp_path: Path, listener: Listener, signed_in: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A model version of ``<experiment>-winner`` with an ``http://<attacker>`` source (the
    report's signature check read it), and one training run whose ``artifact_uri`` was
    rewritten to the attacker's host: the report completes, names that run as one bad run in
    its problems, registers its winner, and the listener got no request."""
    db = tmp_path / "mlflow.db"
    uri = sqlite_store(db)
    ids = make_sweep(uri, "study", "s1", SPECS, tmp_path)
    c = MlflowClient(uri)
    c.create_registered_model("study-winner")
    c.create_model_version("study-winner", run_id=next(iter(ids.values())),
                           source=f"{listener.url}/api/2.0/mlflow-artifacts/artifacts/x")
    (fp, seed), victim = next((k, v) for k, v in ids.items() if k[1] == 1)
    with sqlite3.connect(db) as con:  # anyone who can write the store file can do this
        con.execute("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?",
                    (f"{listener.url}/runs/{victim}", victim))
    con.close()
    done = in_process(["report", "experiment=study", f"tracking.uri={uri}", "device=cpu",
                       f"output_dir={tmp_path / 'reports'}", "plots=false",
                       f"hydra.run.dir={tmp_path / 'report-log'}"], capsys)
    assert done.code == 0, done.stderr[-3000:]
    assert listener.seen == []
    report = (tmp_path / "reports" / "s1" / "report.md").read_text()
    line = next(x for x in report.splitlines() if victim in x and "unreadable" in x)
    assert f"keeps its artifacts at '{listener.url}/runs/{victim}'" in line
    versions = c.search_model_versions("name='study-winner'")
    assert len(versions) == 2  # the planted one and the report's own
    assert PASSWORD not in done.stdout + done.stderr
    assert "version 1 was not registered by a report of this project" in done.stdout + done.stderr


@pytest.mark.slow
def test_sync_into_a_planted_experiment_sends_nothing_there(
        tmp_path: Path, listener: Listener, signed_in: None,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """A run kept locally syncs into the experiment its journal names, which a teammate
    pre-created with the attacker's location: the folder stays pending, nothing is sent."""
    from stability.cli import sync
    from stability.tracking import journal
    from stability.tracking.server import free_port
    from tests.helpers.in_process import call

    uri = sqlite_store(tmp_path / "store" / "mlflow.db")
    folder = tmp_path / "run"
    done = in_process(["sweep", "data.num_samples=200", "device=cpu", "train.epochs=1",
                       f"tracking.uri=http://127.0.0.1:{free_port()}", "tracking.retry_s=1",
                       "tracking.experiment=shared", f"hydra.run.dir={folder}"], capsys)
    assert done.code == 0 and journal.is_pending(folder), done.stderr[-3000:]
    path = folder / "tracking.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(x | {"uri": uri} if x["k"] == "run" else x) + "\n"
                            for x in lines))  # kept while its store was away: now it is back
    MlflowClient(uri).create_experiment("shared", artifact_location=f"{listener.url}/loot")
    done = call(lambda: sync([str(folder), "--uri", uri]), capsys)
    assert done.code == 1, done.stdout + done.stderr
    (line,) = [r.getMessage() for r in caplog.records if "stays pending" in r.getMessage()]
    assert f"experiment 'shared' keeps its artifacts at '{listener.url}/loot'" in line
    assert journal.is_pending(folder)
    assert listener.seen == []


@pytest.mark.slow
def test_a_report_on_a_planted_experiment_is_refused_in_one_line(
        tmp_path: Path, listener: Listener, signed_in: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A whole sweep planted in an experiment whose location is the attacker's host: the
    report stops with one line naming it; no download, no report run upload."""
    uri = sqlite_store(tmp_path / "mlflow.db")
    c = MlflowClient(uri)
    exp = c.create_experiment("lure", artifact_location=f"{listener.url}/lure")
    c.create_run(exp, tags={"stability.kind": "sweep", "stability.sweep_id": "s9"})
    c.create_run(exp, tags={"stability.kind": "train", "stability.sweep_id": "s9",
                            "stability.outcome": "finished"})
    done = in_process(["report", "experiment=lure", f"tracking.uri={uri}", "device=cpu",
                       f"output_dir={tmp_path / 'reports'}", "plots=false",
                       f"hydra.run.dir={tmp_path / 'report-log'}"], capsys)
    assert done.code == 2, done.stderr[-3000:]
    assert f"experiment 'lure' keeps its artifacts at '{listener.url}/lure'" in done.stderr
    assert listener.seen == []


# -- issue 55, item 3: one parser for locations ------------------------------------------------

SERVER = "http://127.0.0.1:5000"
PIECES = ["127.0.0.1", "127.0.0.1.", "evil", "localhost", ":5000", ":5001", ":", ":0", "@", "\\",
          "/", "?", "#", "%40", "%5c", "%2e", " ", "\t", "\n", "\r", "\x00", ".", "[::1]",
          "[", "]", "user:pw", "１２７", "\u3000", "\u200b", ";", "5000", "0x7f.1", "-", "..",
          "ｅvil", "::"]
SHAPES = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=7).map("".join),
    st.lists(st.sampled_from(PIECES), max_size=4).map(lambda p: "127.0.0.1:5000" + "".join(p)),
    st.text(alphabet=st.sampled_from("127.0:5@\\/#?% \tevil[]"), max_size=24))


def _requests_origin(location: str) -> tuple[str, str, int] | None:
    """Scheme, host and port that ``requests`` connects to for an artifact ``location`` (what
    MLflow's HTTP and proxied artifact repositories hand it); None where it refuses to."""
    import requests
    from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository
    from urllib3.util import parse_url

    try:
        url = (MlflowArtifactsRepository.resolve_uri(location, SERVER)
               if location.lower().startswith("mlflow-artifacts:") else location)
        prepared = requests.Request("GET", url.rstrip("/") + "/file").prepare()
        parsed = parse_url(prepared.url)
    except Exception:  # requests (or MLflow) refuses the URL: nothing is sent anywhere
        return None
    scheme = parsed.scheme or ""
    return scheme, parsed.host or "", parsed.port or {"http": 80, "https": 443}.get(scheme, 0)


@settings(max_examples=600, deadline=None, derandomize=True)
@example(scheme="http", authority="127.0.0.1:5000")
@example(scheme="mlflow-artifacts", authority="127.0.0.1:5000")
@example(scheme="http", authority="127.0.0.1:5001\\@127.0.0.1:5000")
@example(scheme="http", authority="127.0.0.1:5001\t@127.0.0.1:5000")
@given(scheme=st.sampled_from(["http", "https", "HTTP", "mlflow-artifacts", "Mlflow-Artifacts"]),
       authority=SHAPES)
def test_the_policy_and_requests_name_the_same_host_and_port(scheme: str, authority: str) -> None:
    """Every location the policy lets through is one ``requests`` connects to on the tracking
    server's own host and port (issue 55, item 3: ``http://127.0.0.1:<L>\\@127.0.0.1:<S>/``
    was port S to ``urllib.parse`` and port L to requests: 30 requests with the password)."""
    location = f"{scheme}://{authority}/api/2.0/mlflow-artifacts/artifacts/1/abc"
    if refusal(SERVER, location):
        return
    assert _requests_origin(location) == ("http", "127.0.0.1", 5000), location


def test_locations_two_parsers_read_differently_are_refused() -> None:
    """The shapes of item 3, each refused in words: a backslash, a control character, white
    space, userinfo, a percent sign, an empty port; the plain server location passes."""
    assert refusal(SERVER, f"{SERVER}/x") == ""
    for bad, why in [("http://127.0.0.1:5001\\@127.0.0.1:5000/x", "'\\\\'"),
                     ("http://127.0.0.1:5001\t@127.0.0.1:5000/x", "'\\t'"),
                     ("http://127.0.0.1:5000/x\\y", "'\\\\'"),
                     ("mlflow-artifacts://127.0.0.1:5000\n/x", "'\\n'"),
                     ("http://evil@127.0.0.1:5000/x", "not a plain host[:port]"),
                     ("http://127.0.0.1%3a5000/x", "not a plain host[:port]"),
                     ("http://127.0.0.1:/x", "not a plain host[:port]"),
                     ("http://127.0.0.1:5000\u3000/x", "'\\u3000'")]:
        assert why in refusal(SERVER, bad), (bad, refusal(SERVER, bad))
    assert _requests_origin("http://127.0.0.1:5001\\@127.0.0.1:5000/x")[2] == 5001  # the trap


@pytest.mark.server
@pytest.mark.slow
def test_a_location_read_two_ways_gets_no_request_from_a_sweep(
        tmp_path: Path, listener: Listener, signed_in: None, mlflow_server,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Item 3 end to end: the project's own server; an experiment's artifact location written
    in its database as ``http://127.0.0.1:<listener>\\@127.0.0.1:<server>/loot`` (MLflow's API
    refuses it: this takes write access to the database). The sweep stops in one line naming
    it; the listener got nothing (30 requests, 30 with the password, before)."""
    server_port = urllib.parse.urlsplit(mlflow_server.uri).port
    location = f"{listener.url}\\@127.0.0.1:{server_port}/loot"
    MlflowClient(mlflow_server.uri).create_experiment("twoway")
    with sqlite3.connect(mlflow_server.root / "mlflow.db") as con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE name = 'twoway'",
                    (location,))
    con.close()
    done = in_process(["sweep", "-m", "+sweep=smoke", "device=cpu", "seed=0",
                       "hydra/launcher=basic", f"tracking.uri={mlflow_server.uri}",
                       "tracking.experiment=twoway", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      capsys)
    assert done.code == 1, done.stderr[-3000:]
    assert "experiment 'twoway' keeps its artifacts at" in done.stderr
    assert "which HTTP clients parse differently" in done.stderr
    assert "Traceback" not in done.stderr
    assert listener.seen == []


def test_only_origins_calls_mlflows_artifact_io() -> None:
    """Item 2: every artifact listing, download and upload goes through ``origins``; no other
    module of the package or the scripts calls MLflow's artifact I/O itself."""
    import re

    io = re.compile(r"\b(download_artifacts|list_artifacts|log_artifacts?|log_text|log_dict|"
                    r"log_figure|log_image|log_table|load_text|load_dict|"
                    r"get_artifact_repository)\s*\(")
    own = (PROJECT / "stability" / "tracking" / "origins.py").resolve()
    calls = [f"{path.relative_to(PROJECT)}:{n}: {line.strip()}"
             for folder in ("stability", "experiments")
             for path in sorted((PROJECT / folder).rglob("*.py")) if path.resolve() != own
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if io.search(line.split("#")[0])]
    assert calls == [], calls
    assert io.search(own.read_text())  # the pattern finds what it looks for
