"""What the management UI costs a node: confirmed publish throughput with the UI open and
refreshing, as a ratio to the same without, in the same run (issue 28, acceptance 3).

A fresh 3-node cluster with http ports; a threaded client publishes 100-byte bodies to the
leader, `--rounds` times without the UI and with it, alternated (off, on, off, on, ...), and the
medians are compared. "With the UI": `--viewer browser` opens headless Debian Chromium (Selenium,
/usr/bin/chromedriver) on the leader's UI, the overview in one window and the bench queue's page
in another, both refreshing as an operator's would (tables every 1.5 s, charts every 5 s),
against the same browser left on about:blank; `--viewer http` replays the same requests from
another process instead (the server's cost without the browser's CPU, which on an operator's
desk is not the node's). Before the rounds, the leader's CPU time per second with no client
traffic is sampled without and with the viewer (`--idle-s` each), and during the rounds with
the UI the loop time the leader spent answering it (its `quorumq_management_read_seconds`).
Prints JSON.

  python scripts/bench_management.py --rounds 5 --count 4000 --viewer browser
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cluster.client import Client
from cluster.launcher import LocalCluster, node_pid, start_cluster

BODY = b"x" * 100
QUEUE = "bench"
UI_REFRESH_S = 1.5  # what the UI's pages poll (app.js REFRESH_MS, CHART_REFRESH_MS)
CHART_REFRESH_S = 5.0
SETTLE_S = 2.0  # after a switch, before measuring
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1000",
)  # fmt: skip


class Viewer(Protocol):
    """The UI open (`show`) or closed (`hide`), and the processes that show it."""

    def show(self) -> None: ...
    def hide(self) -> None: ...
    def close(self) -> None: ...
    def pids(self) -> list[int]: ...


def publish_rate(client: Client, count: int, window: int) -> float:
    """Messages per second for `count` confirmed publishes with `window` in flight."""
    started = time.perf_counter()
    with client.publisher(QUEUE, window=window) as publisher:
        for _ in range(count):
            publisher.publish(BODY)
        publisher.wait_for_confirms(120.0)
    return count / (time.perf_counter() - started)


class BrowserViewer:
    """One headless Chromium for the whole run, logged in on `url`: `show` opens the overview
    and the bench queue's page (two windows), `hide` leaves both on about:blank (the browser
    stays, so its start is in neither phase)."""

    def __init__(self, url: str, password: str) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By

        os.environ["SE_OFFLINE"] = "true"
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        profile = tempfile.mkdtemp(prefix="qq-bench-")
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        self.url = url
        self.profile = profile
        self.driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        self.driver.get(url + "/")
        deadline = time.monotonic() + 20
        while not self.driver.find_elements(By.ID, "login-password"):
            assert time.monotonic() < deadline, "no login form"
            time.sleep(0.1)
        self.driver.find_element(By.ID, "login-password").send_keys(password)
        self.driver.find_element(By.ID, "login-submit").click()
        time.sleep(1.0)
        self.driver.switch_to.new_window("window")
        self.windows = list(self.driver.window_handles)

    def pids(self) -> list[int]:
        """The browser's processes (their command lines name its profile dir)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if self.profile.encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def show(self) -> None:
        """The overview in one window, the bench queue's page in the other."""
        for handle, page in zip(self.windows, ("/#/", f"/#/queue/{QUEUE}"), strict=True):
            self.driver.switch_to.window(handle)
            self.driver.get(self.url + page)

    def hide(self) -> None:
        """Both windows on about:blank: nothing polls."""
        for handle in self.windows:
            self.driver.switch_to.window(handle)
            self.driver.get("about:blank")

    def close(self) -> None:
        """Quit the browser and remove its profile."""
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


POLLER = """
import sys, time, urllib.request
url, header, fast, slow, period, chart_period = sys.argv[1], sys.argv[2], sys.argv[3].split(","), \\
    sys.argv[4].split(","), float(sys.argv[5]), float(sys.argv[6])
last_slow = 0.0
while True:
    due = list(fast)
    if time.monotonic() - last_slow >= chart_period:
        due, last_slow = due + slow, time.monotonic()
    for path in due:
        started = time.perf_counter()
        request = urllib.request.Request(url + path, headers={"Authorization": header})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        print(path.split("?")[0], (time.perf_counter() - started) * 1000, flush=True)
    time.sleep(period)
"""


class HttpViewer:
    """A separate process (not the publisher's GIL) sending what the two open pages send, at
    their periods, while shown; each answer's wall time is kept per path."""

    def __init__(self, url: str, password: str) -> None:
        self.header = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
        self.url = url
        self.process: subprocess.Popen[str] | None = None
        self.request_ms: dict[str, list[float]] = {}  # path -> each answer's wall time

    def pids(self) -> list[int]:
        """The poller's process."""
        return [self.process.pid] if self.process is not None else []

    def show(self) -> None:
        """Start the poller."""
        fast = ["/api/whoami", "/api/overview", f"/api/queues/{QUEUE}",
                f"/api/queues/{QUEUE}/messages?limit=10"]  # fmt: skip
        slow = ["/api/samples", f"/api/queues/{QUEUE}/samples"]
        command = [sys.executable, "-c", POLLER, self.url, self.header, ",".join(fast),
                   ",".join(slow), str(UI_REFRESH_S), str(CHART_REFRESH_S)]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def hide(self) -> None:
        """Stop the poller; keep its answer times."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        out, _ = process.communicate(timeout=10)
        for line in out.splitlines():
            path, elapsed = line.rsplit(" ", 1)
            self.request_ms.setdefault(path, []).append(float(elapsed))

    def close(self) -> None:
        """Stop the poller."""
        self.hide()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_seconds(url: str, password: str) -> float:
    """The leader's loop seconds spent on management reads so far (its /metrics)."""
    auth = base64.b64encode(f"admin:{password}".encode()).decode()
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": "Basic " + auth})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("quorumq_management_read_seconds_sum "):
            return float(line.split()[1])
    return 0.0


def processes_cpu(pids: list[int]) -> float:
    """CPU seconds of processes so far (one gone meanwhile counts 0)."""
    spent = 0.0
    for pid in pids:
        try:
            spent += cpu_seconds(pid)
        except OSError:
            continue
    return spent


def idle_cpu_ms_per_s(pids: list[int], seconds: float) -> float:
    """CPU ms per second processes spend over `seconds` (of no client traffic)."""
    before, started = processes_cpu(pids), time.monotonic()
    time.sleep(seconds)
    return 1000 * (processes_cpu(pids) - before) / (time.monotonic() - started)


@dataclass
class Phase:
    """One side of the comparison: throughput, the leader's CPU per message, the viewer's CPU."""

    rates: list[float] = field(default_factory=list)
    leader_us_per_message: list[float] = field(default_factory=list)
    viewer_ms_per_s: list[float] = field(default_factory=list)

    def run(self, client: Client, args: argparse.Namespace, pid: int, viewer: Viewer) -> None:
        """One round of publishes, with the CPU the leader and the viewer spent on it."""
        client.purge_queue(QUEUE)
        time.sleep(SETTLE_S)  # after a switch: the pages loaded and polling, or closed
        leader, watching, started = cpu_seconds(pid), processes_cpu(viewer.pids()), time.monotonic()
        self.rates.append(publish_rate(client, args.count, args.window))
        self.leader_us_per_message.append(1e6 * (cpu_seconds(pid) - leader) / args.count)
        spent = processes_cpu(viewer.pids()) - watching
        self.viewer_ms_per_s.append(1000 * spent / (time.monotonic() - started))

    def summary(self) -> dict[str, Any]:
        """Each round's throughput and the medians."""
        return {
            "publish_per_s": [round(x) for x in self.rates],
            "median_publish_per_s": round(statistics.median(self.rates)),
            "leader_cpu_us_per_message": round(statistics.median(self.leader_us_per_message), 1),
            "viewer_cpu_ms_per_s": round(statistics.median(self.viewer_ms_per_s), 1),
        }


def measure(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """Idle CPU without and with the viewer, then alternated publish rounds without and with
    it, on the leader's UI."""
    leader = cluster.leader()
    pid = node_pid(cluster.config.node(leader))
    assert pid is not None, f"no pid for {leader}"
    url, password = (
        f"http://127.0.0.1:{cluster.config.node(leader).http_port}",
        cluster.key.decode(),
    )
    viewer: Viewer = (BrowserViewer if args.viewer == "browser" else HttpViewer)(url, password)
    off, on, idle = Phase(), Phase(), {}
    try:
        with cluster.client(leader) as client:
            client.declare_queue(QUEUE)
            publish_rate(client, args.count // 4, args.window)  # warm up
            idle["leader_without_ui"] = round(idle_cpu_ms_per_s([pid], args.idle_s), 1)
            viewer.show()
            time.sleep(SETTLE_S)
            idle["leader_with_ui"] = round(idle_cpu_ms_per_s([pid], args.idle_s), 1)
            idle["viewer"] = round(idle_cpu_ms_per_s(viewer.pids(), args.idle_s), 1)
            served, shown_s = 0.0, 0.0
            for _ in range(args.rounds):
                viewer.hide()
                off.run(client, args, pid, viewer)
                viewer.show()
                before, started = read_seconds(url, password), time.monotonic()
                on.run(client, args, pid, viewer)
                served += read_seconds(url, password) - before
                shown_s += time.monotonic() - started
    finally:
        viewer.close()
    answers = getattr(viewer, "request_ms", {})
    return {
        "viewer": args.viewer,
        "leader": leader,
        "rounds": args.rounds,
        "count": args.count,
        "window": args.window,
        "idle_cpu_ms_per_s": idle,
        "leader_loop_ms_per_s_answering_the_ui": round(1000 * served / shown_s, 2),
        "without_ui": off.summary(),
        "with_ui": on.summary(),
        "ratio_with_to_without": round(
            statistics.median(on.rates) / statistics.median(off.rates), 3
        ),
        "api_request_ms_median": {p: round(statistics.median(t), 2) for p, t in answers.items()},
        "load_average": os.getloadavg(),
    }


def main() -> None:
    """Parse flags, run on a fresh cluster, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=4000, help="publishes per round")
    parser.add_argument("--window", type=int, default=100, help="unconfirmed in flight")
    parser.add_argument("--viewer", choices=("browser", "http"), default="browser")
    parser.add_argument("--idle-s", type=float, default=10.0, help="CPU sampled this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qq-bench-mgmt-") as tmp:
        cluster = start_cluster(Path(tmp) / "D", 3, http_base_port=0)
        try:
            print(json.dumps(measure(cluster, args), indent=2))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
