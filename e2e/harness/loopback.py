"""A throw-away HTTP server on 127.0.0.1 for tests that need something to scrape or call."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free loopback port in a daemon thread; yields `127.0.0.1:PORT`."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def exposition_handler(render: Callable[[], str]) -> type[BaseHTTPRequestHandler]:
    """A handler answering every GET with `render()` in the Prometheus text format (an exporter)."""

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Exporter
