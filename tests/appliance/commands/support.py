"""Helpers of the admin-command tests."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def redirecting_server(path: str) -> Iterator[tuple[str, list[str | None]]]:
    """A server that answers every GET with 302 to another server's ``path``.

    Yields the first server's base URL and the ``Authorization`` headers the
    other one saw: a client that follows the redirect with its token fills it.
    """
    seen: list[str | None] = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Other)

    class Redirect(Other):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_port}{path}")
            self.end_headers()

    first = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    servers = [threading.Thread(target=s.serve_forever, daemon=True) for s in (first, other)]
    for thread in servers:
        thread.start()
    try:
        yield f"http://127.0.0.1:{first.server_port}", seen
    finally:
        first.shutdown()
        other.shutdown()
