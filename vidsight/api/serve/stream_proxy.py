"""The loopback HTTP proxy every http(s) stream source's FFmpeg goes through.

FFmpeg opens what a stream names (an HLS playlist's segments, keys and redirects) by itself, with
its own name lookups. Given this proxy as ``http_proxy`` (which the HLS demuxer passes on to every
segment it opens), each of those requests names its target here first: the target is checked
against the stream rules (`egress`) and the connection goes to the checked address, so a
playlist from a camera cannot send FFmpeg to another host's private address, and a second lookup
cannot either (DNS rebinding). A refused request gets 403 and FFmpeg's open fails.
"""

from __future__ import annotations

import logging
import selectors
import socket
import socketserver
import threading
import urllib.parse

from vidsight.api.serve.egress import EgressRefused, EgressRules

log = logging.getLogger(__name__)
HEADER_LIMIT = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
_proxies: dict[EgressRules, "StreamProxy"] = {}
_lock = threading.Lock()


def proxy_for(rules: EgressRules) -> "StreamProxy":
    """The process's running proxy for ``rules`` (started on first use; its threads are daemons)."""
    with _lock:
        if rules not in _proxies:
            _proxies[rules] = StreamProxy(rules)
        return _proxies[rules]


class StreamProxy:
    """A forward proxy on 127.0.0.1 that connects only where ``rules`` allow.

    Args:
        rules: Where FFmpeg's requests may go.
    """

    def __init__(self, rules: EgressRules):
        handler = type("Handler", (_Handler,), {"rules": rules})
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="vidsight-stream-proxy").start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(socketserver.BaseRequestHandler):
    rules: EgressRules

    def handle(self) -> None:
        self.request.settimeout(CONNECT_TIMEOUT_S)   # a client that connects and says nothing goes
        try:
            head = _read_head(self.request)
        except OSError:
            return
        if head is None:
            return
        self.request.settimeout(None)
        method, target, rest = head
        if method == "CONNECT":   # https (FFmpeg's httpproxy protocol): a tunnel to host:port
            url, forward = f"https://{target}", b""
        else:                     # http: an absolute URL, sent on as a path
            url = target
            parsed = urllib.parse.urlsplit(target)
            path = urllib.parse.urlunsplit(("", "", parsed.path or "/", parsed.query, ""))
            forward = f"{method} {path} HTTP/1.1\r\n".encode() + rest
        try:
            address = self.rules.resolve(url)
            port = urllib.parse.urlsplit(url).port or (443 if method == "CONNECT" else 80)
            upstream = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
        except (EgressRefused, OSError) as exc:
            log.warning("stream proxy: %s", exc)
            status = "403 Forbidden" if isinstance(exc, EgressRefused) else "502 Bad Gateway"
            self.request.sendall(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            return
        with upstream:
            upstream.settimeout(None)
            if method == "CONNECT":
                self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(forward)
            _pipe(self.request, upstream)


def _read_head(connection: socket.socket) -> tuple[str, str, bytes] | None:
    """``(method, target, the header lines and anything after them)`` of the request, Proxy-* headers dropped."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(4096)
        if not chunk or len(data) > HEADER_LIMIT:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    request_line, *headers = head.decode("latin-1").split("\r\n")
    parts = request_line.split()
    if len(parts) != 3:
        return None
    kept = [h for h in headers if not h.lower().startswith("proxy-")]
    return parts[0], parts[1], ("\r\n".join(kept) + "\r\n\r\n").encode("latin-1") + body


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    with selectors.DefaultSelector() as selector:
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in selector.select():
                try:
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:
                    return
