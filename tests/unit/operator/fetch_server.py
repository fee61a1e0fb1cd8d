"""A real HTTP server on 127.0.0.1 whose paths misbehave in the ways fetch must survive."""

from __future__ import annotations

import collections
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubeseer.devcluster import pki

MODEL = b"\x08\x07" + bytes(range(256)) * 64  # 16 KiB of bytes that look like nothing in particular


class Routes:
    """Per-path behaviour and request counts, shared with the handler threads."""

    def __init__(self) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        self.hosts: list[str] = []
        self.failures_before_success = 2
        self.slow_seconds = 1.0
        self.trickle_seconds = 0.05
        self.lock = threading.Lock()
        # Set at teardown so slow handlers finish and the server can join its threads.
        self.release = threading.Event()


def _handler(routes: Routes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            """Keep test output clean."""

        def _send(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            with suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            with routes.lock:
                routes.hits[path] += 1
                count = routes.hits[path]
                routes.hosts.append(self.headers.get("Host", ""))
            port = self.server.server_address[1]
            if path in ("/model", "/a", "/b", "/c"):
                body = MODEL if path == "/model" else path.encode() * 1024
                self._send(200, body)
            elif path == "/flaky":
                if count <= routes.failures_before_success:
                    self._send(503, b"busy")
                else:
                    self._send(200, MODEL)
            elif path == "/missing":
                self._send(404, b"no such model")
            elif path == "/forbidden":
                self._send(403, b"go away")
            elif path == "/slow":
                routes.release.wait(routes.slow_seconds)
                self._send(200, MODEL)
            elif path in ("/trickle", "/silent"):
                # Headers at once, then one byte per `trickle_seconds` (or nothing at all),
                # until the client gives up or the test ends.
                self.send_response(200)
                self.send_header("Content-Length", str(len(MODEL)))
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self.wfile.flush()
                    for byte in MODEL:
                        if routes.release.wait(routes.trickle_seconds):
                            break
                        if path == "/trickle":
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            elif path == "/declared-big":
                self._send(200, b"x" * 10, {"Content-Length": str(10**12)})
            elif path == "/chunked-big":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for _ in range(64):
                        chunk = b"y" * 4096
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
            elif path == "/short":
                self._send(200, b"z" * 100, {"Content-Length": "1000"})
            elif path == "/redirect-ok":
                self._send(302, headers={"Location": "/model"})
            elif path == "/redirect-metadata":
                self._send(302, headers={"Location": "http://169.254.169.254/latest/meta-data/"})
            elif path == "/redirect-localhost":
                self._send(302, headers={"Location": f"http://localhost:{port}/model"})
            elif path == "/redirect-http":
                self._send(302, headers={"Location": f"http://127.0.0.1:{port}/model"})
            elif path == "/redirect-scheme":
                self._send(302, headers={"Location": "file:///etc/passwd"})
            elif path == "/loop":
                self._send(302, headers={"Location": "/loop"})
            else:
                self._send(404)

    return Handler


@contextmanager
def serve(tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, Routes]]:
    """Run the server for one test (https with `tls`); yields its base URL and its routes."""
    routes = Routes()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(routes))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = False  # server_close() joins handler threads: no leaked sockets
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", routes
    finally:
        routes.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def make_tls(directory: Path, hostname: str) -> tuple[ssl.SSLContext, Path]:
    """A throwaway CA and a server certificate for `hostname`: (server context, CA bundle path)."""
    authority = pki.Authority("kubeseer test CA")
    served = authority.issue_server(hostname, ips=(), dns=(hostname,))
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(authority.cert_pem)
    cert_path = directory / "server.pem"
    cert_path.write_bytes(served.cert_pem + served.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path)
    return context, ca_path
