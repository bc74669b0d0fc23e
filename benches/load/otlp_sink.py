#!/usr/bin/env python3
"""The load benchmark's trace collector: an OTLP/HTTP endpoint (`POST /v1/traces`, protobuf
bodies) that floodgate's `[tracing]` and Envoy's OpenTelemetry tracer both export to, so that
both pay the same export. It answers every export 200 with an empty
`ExportTraceServiceResponse` and counts what it received; `GET /stats` gives the counts as JSON.
It does not decode the spans (the end-to-end tests do, in tests/tracing.rs): the benchmark
measures the gateways' cost, and a decoding sink would only take CPU from the machine.
Bodies are capped at 64 MiB; anything else is answered 404."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 * 1024 * 1024
LOCK = threading.Lock()
STATS = {"exports": 0, "bytes": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection

    def log_message(self, *args):  # quiet
        pass

    def reply(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        if self.path != "/v1/traces" or n > MAX_BODY:
            self.close_connection = True
            self.reply(404, b"", "text/plain")
            return
        remaining = n
        while remaining:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                return
            remaining -= len(chunk)
        with LOCK:
            STATS["exports"] += 1
            STATS["bytes"] += n
        self.reply(200, b"", "application/x-protobuf")

    def do_GET(self):
        if self.path != "/stats":
            self.reply(404, b"", "text/plain")
            return
        with LOCK:
            body = json.dumps(STATS).encode()
        self.reply(200, body, "application/json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
