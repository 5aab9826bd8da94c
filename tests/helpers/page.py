"""A report page as a reviewer sees it: headless Chromium at a given width, measured and shot.

``measure`` opens a page (a ``file://`` report.html) in headless Chromium spoken to over
``--remote-debugging-pipe`` (``tests/test_report_browser.Chromium``), at ``width`` CSS pixels,
and returns what the page-layout test asserts: the page's and each table's overflow, the offset
of the first figure and of each heading, the images without alt text. With ``shots`` it also
writes two screenshots: the first screen (``width`` × 1000) and the full page.

Run as a script it measures one report and writes the shots::

    python -m tests.helpers.page reports/<sweep_id>/report.html /tmp/shots/after
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIRST_SCREEN_PX = 1000

# Evaluated in the page: plain numbers and strings, so the test reads one JSON object.
_MEASURE = """(() => {
  const doc = document.documentElement;
  const top = el => el.getBoundingClientRect().top + window.scrollY;
  const imgs = [...document.images];
  const tables = [...document.querySelectorAll('table')].map(t => ({
    width: Math.ceil(t.getBoundingClientRect().width), scroll: t.scrollWidth,
    client: t.clientWidth, open: !t.closest('details') || t.closest('details').open,
    rows: t.rows.length}));
  return JSON.stringify({
    page_width: doc.clientWidth, scroll_width: doc.scrollWidth,
    body_width: Math.ceil(document.body.getBoundingClientRect().width),
    height: doc.scrollHeight,
    first_figure_px: imgs.length ? Math.round(top(imgs[0])) : null,
    first_figure_alt: imgs.length ? imgs[0].alt : null,
    answer_px: document.getElementById('answer') ?
      Math.round(top(document.getElementById('answer'))) : null,
    images: imgs.length, images_without_alt: imgs.filter(i => !i.alt.trim()).length,
    headings: [...document.querySelectorAll('h2, h3, summary')].map(
      h => [h.textContent.trim().slice(0, 60), Math.round(top(h))]),
    tables});
})()"""


def measure(url: str, width: int = 1280, shots: Path | None = None) -> dict[str, Any]:
    """Open ``url`` at ``width`` px; the layout facts (and screenshots into ``shots``)."""
    from tests.report.test_browser import Chromium  # one DevTools client for the suite

    with tempfile.TemporaryDirectory(prefix="page-profile-") as profile:
        chrome = Chromium(Path(profile))
        try:
            target = chrome.send("Target.createTarget", url="about:blank")["targetId"]
            session = chrome.send("Target.attachToTarget", targetId=target,
                                  flatten=True)["sessionId"]
            chrome.send("Emulation.setDeviceMetricsOverride", session, width=width,
                        height=FIRST_SCREEN_PX, deviceScaleFactor=1, mobile=False)
            chrome.send("Page.enable", session)
            chrome.send("Page.navigate", session, url=url)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # loaded and every image decoded
                state = chrome.send("Runtime.evaluate", session, returnByValue=True, expression=(
                    "document.readyState === 'complete' && "
                    "[...document.images].every(i => i.complete)"))["result"].get("value")
                if state:
                    break
                time.sleep(0.3)
            got = chrome.send("Runtime.evaluate", session, expression=_MEASURE,
                              returnByValue=True)["result"]["value"]
            facts = json.loads(got)
            if shots is not None:
                shots.parent.mkdir(parents=True, exist_ok=True)
                first = chrome.send("Page.captureScreenshot", session, format="png")["data"]
                Path(f"{shots}-first-screen.png").write_bytes(base64.b64decode(first))
                full = chrome.send("Page.captureScreenshot", session, format="png",
                                   captureBeyondViewport=True,
                                   clip={"x": 0, "y": 0, "width": width,
                                         "height": facts["height"], "scale": 1})["data"]
                Path(f"{shots}-full-page.png").write_bytes(base64.b64decode(full))
            return facts
        finally:
            chrome.close()


if __name__ == "__main__":
    page, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]) if len(sys.argv) > 2 else None
    print(json.dumps(measure(page.as_uri(), shots=out), indent=1))
