"""The servers a team would otherwise hand-roll around the same model: one request in, pre-processing, one
onnxruntime run, post-processing, one response out. No batching, one process. They speak the KServe v2 protocol
(JSON and Triton's binary extension, kserve.py) on POST /v2/models/<model>/infer, so the very request body sent to
Triton works here too, and GET /v2/health/ready answers 200.

    var/bench-env/bin/python bench/serving/handrolled.py --server tornado|threading --workload KEY \
        --artifacts DIR --port PORT

- tornado: a tornado.web.Application with a synchronous `post()` handler, started with `app.listen(port)`: one
  process, one event loop; inference blocks the loop, as in most Tornado model servers.
- threading: the standard library's http.server.ThreadingHTTPServer, a thread per connection, HTTP/1.1 keep-alive,
  TCP_NODELAY (`disable_nagle_algorithm`: otherwise headers and body go out as two segments and Nagle's algorithm
  against delayed ACKs adds ~40 ms to answers). All threads share one onnxruntime session (its run() is
  thread-safe).

Both use the workload's Pipeline (workloads.py): onnxruntime's default session options, the same pre/post code
as the Triton python models.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kserve import HEADER_LENGTH, decode_request, encode_response, error_body  # noqa: E402
from workloads import WORKLOADS, Pipeline  # noqa: E402


def handle(pipeline: Pipeline, model: str, body: bytes, header_length: str | None) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one inference request."""
    if model != pipeline.workload.model:
        return 404, error_body(f"unknown model {model!r}"), {"Content-Type": "application/json"}
    try:
        inputs, requested = decode_request(body, header_length)
        outputs = pipeline.infer(inputs)
        payload, headers = encode_response(model, outputs, requested)
    except Exception as exc:  # noqa: BLE001 - the client gets the error, the server keeps going
        traceback.print_exc()
        return 400, error_body(str(exc)), {"Content-Type": "application/json"}
    return 200, payload, headers


def serve_tornado(pipeline: Pipeline, port: int) -> None:
    import tornado.ioloop
    import tornado.web

    class Infer(tornado.web.RequestHandler):
        def post(self, model: str) -> None:
            status, payload, headers = handle(pipeline, model, self.request.body,
                                              self.request.headers.get(HEADER_LENGTH))
            self.set_status(status)
            for key, value in headers.items():
                self.set_header(key, value)
            self.write(payload)

    class Ready(tornado.web.RequestHandler):
        def get(self) -> None:
            self.write(b"")

    app = tornado.web.Application([(r"/v2/models/([^/]+)/infer", Infer), (r"/v2/health/ready", Ready)])
    app.listen(port, address="127.0.0.1")
    tornado.ioloop.IOLoop.current().start()


def serve_threading(pipeline: Pipeline, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            parts = self.path.strip("/").split("/")
            if len(parts) != 4 or parts[:2] != ["v2", "models"] or parts[3] != "infer":
                self._send(404, error_body("not found"), {"Content-Type": "application/json"})
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(*handle(pipeline, parts[2], body, self.headers.get(HEADER_LENGTH)))

        def do_GET(self) -> None:  # noqa: N802
            self._send(200 if self.path == "/v2/health/ready" else 404, b"", {})

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet, as a production server
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("tornado", "threading"), required=True)
    parser.add_argument("--workload", choices=[w.key for w in WORKLOADS.values()], required=True)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    workload = next(w for w in WORKLOADS.values() if w.key == args.workload)
    pipeline = Pipeline(workload, args.artifacts)
    (serve_tornado if args.server == "tornado" else serve_threading)(pipeline, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
