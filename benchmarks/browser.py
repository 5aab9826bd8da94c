"""Headless Chromium driven over the DevTools protocol: how long until a page shows something.

``tests/test_ui_browser.py`` renders with ``--dump-dom`` and virtual time, which says *what* the
MLflow UI shows; for *when*, the page is opened in a running browser and polled: Chromium runs
with ``--remote-debugging-pipe`` (DevTools messages on file descriptors 3 and 4, NUL-separated
JSON, so no WebSocket client is needed), a new tab navigates to the URL, and a JavaScript
condition is evaluated every ``POLL_S`` until it holds. The time is from the navigation request
to the first poll that sees it, so it includes loading and running the UI's JavaScript, its
REST calls to the server and the rendering.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync",
         "--window-size=1600,1000"]  # the project's flags (tests/test_ui_browser.py)
POLL_S = 0.1


class Browser:
    """One Chromium with a fresh profile in ``profile``; ``close`` ends it."""

    def __init__(self, profile: Path) -> None:
        cmd_r, cmd_w = os.pipe()  # we write, Chromium reads fd 3
        evt_r, evt_w = os.pipe()  # Chromium writes fd 4, we read
        # Above any fd the child could have, so the dup2s below cannot overwrite each other.
        hi_r, hi_w = os.dup2(cmd_r, 101), os.dup2(evt_w, 102)

        def child() -> None:
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child, close_fds=False, start_new_session=True)
        for fd in (cmd_r, evt_w, hi_r, hi_w):
            os.close(fd)
        self._out = os.fdopen(cmd_w, "wb", buffering=0)
        self._in = os.fdopen(evt_r, "rb", buffering=0)
        self._next = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while chunk := self._in.read(65536):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout_s: float = 60) -> dict[str, Any]:
        """One DevTools command; its result.

        Raises:
            RuntimeError: Chromium answered with an error or not in time.
        """
        with self._cond:
            self._next += 1
            ident = self._next
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._out.write(json.dumps(msg).encode() + b"\0")
        with self._cond:
            if not self._cond.wait_for(lambda: ident in self._replies, timeout_s):
                raise RuntimeError(f"Chromium did not answer {method} within {timeout_s} s")
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def time_until(self, url: str, condition: str, timeout_s: float = 120) -> float:
        """Seconds from navigating a new tab to ``url`` until JavaScript ``condition`` is true.

        Raises:
            TimeoutError: the condition did not hold within ``timeout_s``.
        """
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        try:
            t0 = time.perf_counter()
            self.send("Page.navigate", {"url": url}, session)
            while time.perf_counter() - t0 < timeout_s:
                got = self.send("Runtime.evaluate", {"expression": f"!!({condition})",
                                                     "returnByValue": True}, session)
                if got.get("result", {}).get("value") is True:
                    return time.perf_counter() - t0
                time.sleep(POLL_S)
            raise TimeoutError(f"{url}: `{condition}` not true after {timeout_s} s")
        finally:
            self.send("Target.closeTarget", {"targetId": target})

    def text(self, url: str, wait_s: float) -> str:
        """The page's visible text ``wait_s`` seconds after navigating (for diagnostics)."""
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        session = self.send("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        time.sleep(wait_s)
        got = self.send("Runtime.evaluate", {"expression": "document.body.innerText",
                                             "returnByValue": True}, session)
        self.send("Target.closeTarget", {"targetId": target})
        return str(got.get("result", {}).get("value", ""))

    def close(self) -> None:
        """End Chromium (its whole process group)."""
        with contextlib.suppress(RuntimeError, OSError):  # it may be gone already
            self.send("Browser.close", timeout_s=10)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=15)
        self._out.close()
