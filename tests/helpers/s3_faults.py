"""A fault-injecting HTTP proxy on loopback in front of the test S3 server (helpers.s3_server), so a store's
failures reach the real client stack (fsspec, s3fs, aiobotocore, botocore's retries) exactly as a worker meets them:
no mocks. One thread serves it; the mode is switched while clients use it:

    proxy = FaultProxy(upstream_endpoint).start()
    proxy.deny()          # every PUT/POST answered 403 with S3's AccessDenied body
    proxy.throttle(5)     # the next 5 requests answered 503 with S3's SlowDown body, then passed on
    proxy.cut_put(2)      # the 2nd PUT from now: part of its body read, then the connection closed, no answer
    proxy.cut_put(2, drain=True)  # the same, the rest of the body read (and dropped) before the close
    proxy.passthrough()   # everything passed on again

`only=` limits a throttle or a cut to requests whose key (the path, without the query) contains that text: one
checkpoint folder's upload, whatever else goes on meanwhile.

A cut with the body's rest unread is a reset to a client still sending (botocore: EndpointConnectionError, which
s3fs does not retry) and a closed connection to one that has sent it all (ConnectionClosedError, which it retries):
which one depends on timing. `drain=True` always gives the second, for a test that counts the client's tries.

`proxy.log` keeps (method, key, status) of every request; status "cut" for a cut one. An endpoint nobody listens on
(`unreachable_endpoint()`) needs no proxy.
"""

from __future__ import annotations

import http.client
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from helpers.s3_server import free_port

DENIED = (403, "AccessDenied", "Access Denied")
SLOW_DOWN = (503, "SlowDown", "Please reduce your request rate.")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def error_body(code: str, message: str, key: str) -> bytes:
    """An S3 error document, as the real service words it."""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"<Resource>{key}</Resource><RequestId>llmtrain-test</RequestId></Error>").encode()


def unreachable_endpoint() -> str:
    """An endpoint on a free loopback port that nobody listens on: every connection is refused."""
    return f"http://127.0.0.1:{free_port()}"


@dataclass
class Request:
    method: str
    key: str  # the path, without the query
    status: int | str  # the status answered, or "cut"


class FaultProxy:
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.lock = threading.Lock()
        self.log: list[Request] = []
        self._deny = False
        self._throttle = 0  # requests still to answer with SlowDown
        self._cut_at: int | None = None  # PUTs still to pass before the first cut one
        self._cuts = 0  # consecutive PUTs to cut from there
        self._throttle_only = self._cut_only = ""
        self._drain = False
        self.server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    # ---- modes -----------------------------------------------------------------------------------------------
    def passthrough(self) -> None:
        with self.lock:
            self._deny, self._throttle, self._cut_at, self._cuts = False, 0, None, 0
            self._throttle_only = self._cut_only = ""

    def deny(self) -> None:
        with self.lock:
            self._deny = True

    def throttle(self, n: int, only: str = "") -> None:
        with self.lock:
            self._throttle, self._throttle_only = n, only

    def cut_put(self, n: int = 1, times: int = 1, only: str = "", drain: bool = False) -> None:
        """Cut the n-th PUT from now, and the `times` - 1 PUTs after it (a client retries a cut request: enough
        cuts in a row outlast its retries)."""
        with self.lock:
            self._cut_at, self._cuts, self._cut_only, self._drain = n - 1, times, only, drain

    # ---- what happened ---------------------------------------------------------------------------------------
    def requests(self, method: str | None = None, status: int | str | None = None) -> list[Request]:
        with self.lock:
            return [r for r in self.log if (method is None or r.method == method)
                    and (status is None or r.status == status)]

    def clear_log(self) -> None:
        with self.lock:
            self.log.clear()

    # ---- the decision for one request ------------------------------------------------------------------------
    def _fault(self, method: str, key: str) -> str | None:
        with self.lock:
            if self._throttle > 0 and self._throttle_only in key:
                self._throttle -= 1
                return "throttle"
            if self._deny and method in ("PUT", "POST"):
                return "deny"
            if method == "PUT" and self._cut_at is not None and self._cut_only in key:
                if self._cut_at > 0:
                    self._cut_at -= 1
                    return None
                self._cuts -= 1
                if self._cuts <= 0:
                    self._cut_at = None
                return "drained cut" if self._drain else "cut"
            return None

    def _record(self, method: str, key: str, status: int | str) -> None:
        with self.lock:
            self.log.append(Request(method, key, status))

    # ---- life ------------------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="s3-fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _handler(proxy: FaultProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect

        def log_message(self, *args) -> None:  # quiet: the proxy's log is `proxy.log`
            pass

        def _body(self, limit: int | None = None) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                return self._chunked()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length if limit is None else min(limit, length))

        def _chunked(self) -> bytes:
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()

        def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _cut(self, drain: bool) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            half = length // 2
            self.rfile.read(half)
            if drain:
                self.rfile.read(length - half)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _serve(self) -> None:
            key = self.path.split("?", 1)[0]
            fault = proxy._fault(self.command, key)
            if fault in ("cut", "drained cut"):
                proxy._record(self.command, key, "cut")
                self._cut(drain=fault == "drained cut")
                return
            body = self._body()
            if fault in ("throttle", "deny"):
                status, code, message = SLOW_DOWN if fault == "throttle" else DENIED
                proxy._record(self.command, key, status)
                self._answer(status, error_body(code, message, key), [("Content-Type", "application/xml")])
                return
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                kept = [(k, v) for k, v in response.getheaders()
                        if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"]
            finally:
                upstream.close()
            proxy._record(self.command, key, response.status)
            if self.command == "HEAD":  # a HEAD answer's length is the object's, not of an empty body
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in HOP_BY_HOP:
                        self.send_header(name, value)
                self.end_headers()
                return
            self._answer(response.status, data, kept)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler
