"""A server on a loopback port in a thread of this process (benchmarks and tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from vidsight.errors import VidsightError


@contextlib.contextmanager
def serve_in_background(app, host: str = "127.0.0.1", start_timeout_s: float = 120.0) -> Iterator[str]:
    """Serve ``app`` on a free port; yields its base URL; stops it gracefully on exit."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning",
                                           timeout_graceful_shutdown=30))
    thread = threading.Thread(target=server.run, daemon=True, name="vidsight-serve")
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise VidsightError(f"the server did not start on {host} within {start_timeout_s:g} s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(60)
