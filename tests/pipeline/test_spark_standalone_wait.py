"""`StandaloneCluster.wait_ready` against a stand-in master web UI (no JVM): an answer that is
not JSON yet (Spark 4.3's master served an HTML page at `/json` in the instant between binding
its UI and becoming ALIVE: one run of the README test command failed on a JSONDecodeError) is
waited through, and a UI that never answers JSON fails naming what it answered."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.pipeline.spark_standalone import StandaloneCluster

HTML = b'<!DOCTYPE html><html data-bs-theme="light"><body>Spark Master</body></html>'
READY = b'{"aliveworkers": 1, "status": "ALIVE"}'


@contextmanager
def master_ui(answers: list[bytes]) -> Iterator[tuple[int, list[str]]]:
    """A web UI on a free port answering each GET with the next of `answers` (the last one
    repeated); yields its port and the paths asked for. Stopped on exit."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            body = answers[min(len(paths), len(answers)) - 1]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-master-ui", daemon=True)
    thread.start()
    try:
        yield server.server_address[1], paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def cluster_on(tmp_path: Path, port: int) -> StandaloneCluster:
    cluster = StandaloneCluster(tmp_path)  # launched by nobody: no daemon to watch or stop
    cluster.ui_port = port
    return cluster


def test_an_html_answer_before_the_master_is_alive_is_waited_through(tmp_path: Path) -> None:
    with master_ui([HTML, HTML, READY]) as (port, paths):
        cluster_on(tmp_path, port).wait_ready(timeout_s=20)
    assert paths == ["/json"] * 3


def test_a_ui_that_never_answers_json_fails_naming_its_answer(tmp_path: Path) -> None:
    with master_ui([HTML]) as (port, _paths), pytest.raises(RuntimeError) as raised:
        cluster_on(tmp_path, port).wait_ready(timeout_s=1.5)
    assert "no worker registered within 1.5 s" in str(raised.value)
    assert "Spark Master" in str(raised.value)  # what the UI last answered
