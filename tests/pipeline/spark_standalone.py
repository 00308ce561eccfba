"""A real Spark standalone cluster (one master, one worker) from the installed pyspark, for tests.

Both run pyspark's own launcher classes through its `bin/spark-class`, bound to 127.0.0.1, with
every directory (logs, work, scratch) under a temporary directory; `stop()` kills both process
groups and is safe to call at any time (also after a failed start).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pyspark

from cluster.launcher import free_ports

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class StandaloneCluster:
    """`start()` a master and a worker; `url` is the `spark://` master URL."""

    def __init__(self, root: Path, cores: int = 2, memory: str = "2g") -> None:
        self.root = root
        self.cores = cores
        self.memory = memory
        self.port, self.ui_port, self.worker_ui_port = free_ports(3)
        self.url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []

    def env(self) -> dict[str, str]:
        """The environment of the daemons (and of drivers that talk to them)."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_WORKER_DIR=str(self.root / "work"),
            SPARK_LOCAL_DIRS=str(self.root / "scratch"),
            SPARK_PID_DIR=str(self.root / "pids"),
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _launch(self, name: str, *args: str) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115  (closed in stop())
        self.logs.append(log)
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=self.env(),
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() kills the JVM's children too
        )
        self.processes.append(process)

    def start(self, timeout_s: float = 60.0) -> StandaloneCluster:
        """Start both daemons and wait until the worker registered with the master."""
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> StandaloneCluster:
        """Start both daemons without waiting (the caller can work while the JVMs boot)."""
        for sub in ("logs", "work", "scratch", "pids"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._launch(
                "master", MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                "--webui-port", str(self.ui_port),
            )  # fmt: skip
            self._launch(
                "worker", WORKER_CLASS, self.url, "--host", "127.0.0.1",
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.root / "work"), "--webui-port", str(self.worker_ui_port),
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> StandaloneCluster:
        """Wait until the worker registered with the master (stops both if it does not)."""
        try:
            self._wait_for_worker(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_worker(self, timeout_s: float) -> None:
        """Poll the master UI's `/json` until it counts a live worker. An answer that is not
        JSON is waited through: Spark 4.3's master served an HTML page there in the instant
        between binding its UI and becoming ALIVE."""
        deadline = time.monotonic() + timeout_s
        answer = "nothing"
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a spark daemon exited: {self.output()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.ui_port}/json", timeout=2
                ) as r:
                    answer = r.read().decode(errors="replace")
                state: dict[str, Any] = json.loads(answer)
                if int(state.get("aliveworkers", 0)) >= 1:
                    return
            except OSError as e:  # not listening yet
                answer = repr(e)
            except ValueError:  # not JSON yet: `answer` holds it
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"no worker registered within {timeout_s} s; the master UI last answered "
            f"{answer[:300]!r}: {self.output()}"
        )

    def output(self) -> str:
        """The daemons' last log lines (for failure messages)."""
        text = ""
        for name in ("master", "worker"):
            path = self.root / f"{name}.out"
            if path.exists():
                text += f"\n--- {name} ---\n" + "\n".join(path.read_text().splitlines()[-15:])
        return text

    def stop(self) -> None:
        """Kill both daemons (and their executors) and wait for them."""
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self.processes.clear()
        for log in self.logs:
            log.close()
        self.logs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def isolated_python(directory: Path) -> Path:
    """An executor interpreter that cannot import quorumq from this checkout: `python -S`
    (no site: the editable install's .pth is not read) with only the third-party site-packages
    on its path. quorumq must come from the zip the job ships."""
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    script = directory / "executor-python"
    script.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{site_packages}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" -S "$@"\n'
    )
    script.chmod(0o755)
    return script
