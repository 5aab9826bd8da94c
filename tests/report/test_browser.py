"""The report inside the MLflow UI: headless Chromium opens the report run's ``report.html``.

The UI shows an HTML artifact in a sandboxed iframe fed from a blob URL, which ``--dump-dom``
does not descend into. So Chromium is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: NUL-separated JSON on file descriptors 3 and 4, no extra
package): open the artifact page, wait until the iframe's document shows the answer, read the
rendered text of that frame and take a screenshot. The sweep's parent run page is checked too:
its description carries the answer.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from stability.report import ReportConfig, build_report
from stability.tracking.contract import Artifact, Tag
from tests.helpers.report_fixtures import Spec, make_sweep

pytestmark = [pytest.mark.browser, pytest.mark.server, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOT_DIR = Path(os.environ.get("STABILITY_SCREENSHOT_DIR", "reports/screenshots"))


class Chromium:
    """Headless Chromium spoken to over ``--remote-debugging-pipe``."""

    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds() -> None:  # Chromium reads commands on fd 3 and writes replies on fd 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)  # via high numbers: a pipe end may itself be fd 3 or 4
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             "--disable-sync", f"--user-data-dir={profile}", "--window-size=1400,1000",
             # the artifact viewer's sandboxed iframe in the page's process: one frame tree
             "--disable-features=IsolateSandboxedIframes",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4),  # kept open past the close_fds step
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id = b"", 0

    def send(self, method: str, session: str | None = None, **params: Any) -> dict:
        """One DevTools command; returns its result (events in between are dropped)."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                assert chunk, "Chromium closed the DevTools pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply["error"]
                return reply["result"]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        os.close(self._w)
        os.close(self._r)


def frame_texts(chrome: Chromium, session: str) -> dict[str, str]:
    """``{frame url: rendered text}`` of every frame of the page (an isolated world in each)."""
    tree = chrome.send("Page.getFrameTree", session)["frameTree"]
    frames, texts = [tree], {}
    while frames:
        node = frames.pop()
        frames += node.get("childFrames", [])
        frame = node["frame"]
        ctx = chrome.send("Page.createIsolatedWorld", session, frameId=frame["id"])
        got = chrome.send("Runtime.evaluate", session, expression="document.body ? "
                          "document.body.innerText : ''", contextId=ctx["executionContextId"],
                          returnByValue=True)
        texts[frame["url"]] = got["result"].get("value", "")
    return texts


def open_and_read(url: str, profile: Path, wanted: str, shot: Path,
                  timeout_s: float = 90) -> dict[str, str]:
    """Open ``url``, wait until some frame's text contains ``wanted``, screenshot the page."""
    chrome = Chromium(profile)
    try:
        target = chrome.send("Target.createTarget", url="about:blank")["targetId"]
        session = chrome.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        chrome.send("Page.enable", session)
        chrome.send("Page.navigate", session, url=url)
        deadline, texts = time.monotonic() + timeout_s, {}
        while time.monotonic() < deadline:
            texts = frame_texts(chrome, session)
            if any(wanted in t for t in texts.values()):
                time.sleep(1.0)  # the figures decode after the text is laid out
                break
            time.sleep(0.5)
        png = chrome.send("Page.captureScreenshot", session, format="png")["data"]
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(base64.b64decode(png))
        return texts
    finally:
        chrome.close()


def not_blank(png: Path) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot."""
    image = Image.open(io.BytesIO(png.read_bytes())).convert("RGB").resize((350, 250))
    pixels = list(image.getdata())
    return len(set(pixels)), sum(p != (255, 255, 255) for p in pixels) / len(pixels)


def test_the_report_opens_in_the_mlflow_ui_with_its_answer_and_figures(mlflow_server, tmp_path):
    assert Path(CHROMIUM).exists(), "install Chromium: apt-get install chromium (make setup-dev)"
    uri, exp = mlflow_server.uri, "report-browser"
    make_sweep(uri, exp, "ui-sweep", [
        Spec(precision="bf16", clip=1.0, accum=2, losses={0: 0.40, 1: 0.41, 2: 0.42}),
        Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52, 2: 0.51}),
        Spec(precision="fp16", clip=None, accum=1, losses={0: 0.45, 1: 0.47, 2: 0.46}, skips=2)],
               tmp_path)
    out = build_report(ReportConfig(tracking_uri=uri, experiment=exp, device="cpu",
                                    output_dir=str(tmp_path / "reports"),
                                    model_name="browser-winner"))
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name(exp).experiment_id
    answer = "Train with bf16 clip=1 acc=2"
    page = f"{uri}/#/experiments/{exp_id}/runs/{out.report_run_id}/artifactPath/" \
           f"{Artifact.REPORT_HTML}"
    shot = SCREENSHOT_DIR / f"report-{out.report_run_id}.png"
    texts = open_and_read(page, tmp_path / "profile-1", answer, shot)
    report_frames = [t for u, t in texts.items() if u != page and answer in t]
    assert report_frames, f"the report's answer is not in any frame: {list(texts)}"
    assert "Stability: The chosen config is stable" in report_frames[0]
    # the answer table: each level's gap to the best with its MCB bound and its Holm verdict
    assert "at most (MCB 95%)" in report_frames[0]
    assert re.search(r"(helps|hurts|equivalent|undecided)", report_frames[0])
    colours, ink = not_blank(shot)
    assert colours > 50 and ink > 0.05, (colours, ink)  # figures and text, not a blank frame

    parent = c.get_run(c.get_run(out.report_run_id).data.tags["stability.sweep_run_id"])
    assert answer in parent.data.tags[Tag.NOTE].replace("**", "").replace("`", "")
    assert parent.data.tags[Tag.REPORT_RUN_ID] == out.report_run_id
    assert parent.data.tags[Tag.WINNER] == out.winner
    parent_page = f"{uri}/#/experiments/{exp_id}/runs/{parent.info.run_id}"
    texts = open_and_read(parent_page, tmp_path / "profile-2", answer,
                          SCREENSHOT_DIR / f"sweep-{parent.info.run_id}.png")
    assert any(answer in t for t in texts.values()), "the parent run page lacks the answer"
