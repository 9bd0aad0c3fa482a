"""The fake API server's transport: HTTPS (TLS 1.2+, the handshake in the handler thread),
and answers written with the headers kube-apiserver sends (JSON with Audit-Id and the
priority-and-fairness headers; streams chunked, flushed per chunk)."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localrun.cluster.apirequest import Answer, JsonObject, Raw, Reply

log = logging.getLogger(__name__)


class Handler(http.server.BaseHTTPRequestHandler):
    """Every method goes to the server's `dispatch` (FakeApiServer.handle)."""

    server: HttpsServer
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver-fake"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self.server.dispatch(self)

    def do_PATCH(self) -> None:
        self.server.dispatch(self)

    def do_PUT(self) -> None:
        self.server.dispatch(self)

    def do_POST(self) -> None:
        self.server.dispatch(self)

    def do_DELETE(self) -> None:
        self.server.dispatch(self)


class HttpsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    dispatch: Callable[[Handler], None]
    ssl_context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        # The handshake runs in the handler thread: a client that never completes it
        # must not stall the accept loop.
        tls = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class HttpsServer6(HttpsServer):
    address_family = socket.AF_INET6


def https_server(
    host: str, port: int, dispatch: Callable[[Handler], None], cert: Path, key: Path
) -> HttpsServer:
    """A threading HTTPS server on (host, port) whose requests go to `dispatch`."""
    cls = HttpsServer6 if ":" in host else HttpsServer
    server = cls((host, port), Handler)
    server.dispatch = dispatch
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    server.ssl_context = ctx
    return server


def send_json(req: Handler, code: int, payload: JsonObject, *, retry_after: bool = False) -> None:
    data = json.dumps(payload).encode()
    req.send_response(code)
    req.send_header("Audit-Id", str(uuid.uuid4()))
    req.send_header("Cache-Control", "no-cache, private")
    req.send_header("Content-Type", "application/json")
    req.send_header("X-Kubernetes-Pf-Flowschema-Uid", "f2d1b2a0-6d0e-4c55-9f3e-0a1b2c3d4e5f")
    req.send_header("X-Kubernetes-Pf-Prioritylevel-Uid", "0d6c3b5e-2f4a-4b8e-8c1d-5e6f7a8b9c0d")
    if retry_after:
        req.send_header("Retry-After", "1")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


def send_answer(req: Handler, answer: Answer) -> None:
    if isinstance(answer, Reply):
        send_json(req, answer.code, answer.payload)
        return
    req.send_response(answer.code)
    req.send_header("Audit-Id", str(uuid.uuid4()))
    req.send_header("Cache-Control", "no-cache, private")
    req.send_header("Content-Type", answer.content_type)
    if isinstance(answer, Raw):
        req.send_header("Content-Length", str(len(answer.data)))
        req.end_headers()
        req.wfile.write(answer.data)
        return
    # A stream (watch, log follow): chunked, flushed per chunk, ended by a last chunk.
    req.send_header("Transfer-Encoding", "chunked")
    req.end_headers()
    try:
        for chunk in answer.chunks:
            if chunk:
                req.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                req.wfile.flush()
        req.wfile.write(b"0\r\n\r\n")
        req.wfile.flush()
    except (OSError, ssl.SSLError):
        req.close_connection = True  # the client went away
