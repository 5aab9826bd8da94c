"""A loopback proxy that signs a headless browser in to an MLflow server with basic-auth."""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def signed_in_proxy(target: str, user: str, password: str) -> Iterator[str]:
    """A loopback HTTP proxy to ``target`` that signs every request in as ``user``.

    Headless Chromium cannot answer the basic-auth prompt, and credentials in the page URL
    are not sent with the UI's own API calls; a person's browser, once signed in, sends the
    ``Authorization`` header with every request to the origin, which is what this adds.

    Yields:
        The proxy's base URL.
    """
    import requests

    token = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    hop = {"connection", "keep-alive", "transfer-encoding", "content-encoding",
           "content-length", "host"}

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            r = requests.request(self.command, target + self.path, headers=headers | {
                "Authorization": token}, data=self.rfile.read(length) if length else None,
                timeout=60)
            self.send_response(r.status_code)
            for k, v in r.headers.items():
                if k.lower() not in hop:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = do_POST = do_PATCH = do_DELETE = _forward

        def log_message(self, *args: Any) -> None:  # quiet: the test reports what matters
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
