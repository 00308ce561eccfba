"""What the management UI costs a node: confirmed publish throughput with the UI open and
refreshing, as a ratio to the same without, in the same run (issue 28, acceptance 3).

A fresh 3-node cluster with http ports; a threaded client publishes 100-byte bodies to the
leader, `--rounds` times without the UI and with it, alternated (off, on, off, on, ...), and the
medians are compared. "With the UI": `--viewer browser` opens headless Debian Chromium (Selenium,
/usr/bin/chromedriver) on the leader's UI, the overview in one window and the bench queue's page
in another, both refreshing as an operator's would (tables every 1.5 s, charts every 5 s),
against the same browser left on about:blank;
`--viewer http` replays the same requests from a thread instead (the server's cost without the
browser's CPU, which on an operator's desk is not the node's). Prints JSON.

  python scripts/bench_management.py --rounds 5 --count 4000 --viewer browser
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster.client import Client
from cluster.launcher import LocalCluster, start_cluster

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
        """Quit the browser."""
        self.driver.quit()


class HttpViewer:
    """A thread sending what the two open pages send, at their periods, while shown."""

    def __init__(self, url: str, password: str) -> None:
        auth = base64.b64encode(f"admin:{password}".encode()).decode()
        self.header = {"Authorization": "Basic " + auth}
        self.url = url
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.request_ms: dict[str, list[float]] = {}  # path -> each answer's wall time

    def show(self) -> None:
        """Start polling."""
        self.stop.clear()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def hide(self) -> None:
        """Stop polling."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)

    def close(self) -> None:
        """Stop polling."""
        self.hide()

    def _poll(self) -> None:
        fast = ["/api/whoami", "/api/overview", f"/api/queues/{QUEUE}",
                f"/api/queues/{QUEUE}/messages?limit=10"]  # fmt: skip
        slow = ["/api/samples", f"/api/queues/{QUEUE}/samples"]
        last_slow = 0.0
        while not self.stop.is_set():
            due = list(fast)
            if time.monotonic() - last_slow >= CHART_REFRESH_S:
                due, last_slow = due + slow, time.monotonic()
            for path in due:
                request = urllib.request.Request(self.url + path, headers=self.header)
                started = time.perf_counter()
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
                elapsed = (time.perf_counter() - started) * 1000
                self.request_ms.setdefault(path.split("?")[0], []).append(elapsed)
            self.stop.wait(UI_REFRESH_S)


def measure(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """Alternated rounds without and with the viewer on the leader's UI."""
    leader = cluster.leader()
    port = cluster.config.node(leader).http_port
    url, password = f"http://127.0.0.1:{port}", cluster.key.decode()
    viewer = (BrowserViewer if args.viewer == "browser" else HttpViewer)(url, password)
    off: list[float] = []
    on: list[float] = []
    try:
        with cluster.client(leader) as client:
            client.declare_queue(QUEUE)
            publish_rate(client, args.count // 4, args.window)  # warm up
            for _ in range(args.rounds):
                client.purge_queue(QUEUE)
                viewer.hide()
                time.sleep(SETTLE_S)
                off.append(publish_rate(client, args.count, args.window))
                client.purge_queue(QUEUE)
                viewer.show()
                time.sleep(SETTLE_S)  # the pages loaded and polling
                on.append(publish_rate(client, args.count, args.window))
    finally:
        viewer.close()
    answers = getattr(viewer, "request_ms", {})
    return {
        "api_request_ms_median": {
            path: round(statistics.median(times), 2) for path, times in answers.items()
        },
        "viewer": args.viewer,
        "leader": leader,
        "rounds": args.rounds,
        "count": args.count,
        "window": args.window,
        "publish_per_s_without_ui": [round(x) for x in off],
        "publish_per_s_with_ui": [round(x) for x in on],
        "median_without_ui": round(statistics.median(off)),
        "median_with_ui": round(statistics.median(on)),
        "ratio_with_to_without": round(statistics.median(on) / statistics.median(off), 3),
        "load_average": os.getloadavg(),
    }


def main() -> None:
    """Parse flags, run on a fresh cluster, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=4000, help="publishes per round")
    parser.add_argument("--window", type=int, default=100, help="unconfirmed in flight")
    parser.add_argument("--viewer", choices=("browser", "http"), default="browser")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qq-bench-mgmt-") as tmp:
        cluster = start_cluster(Path(tmp) / "D", 3, http_base_port=0)
        try:
            print(json.dumps(measure(cluster, args), indent=2))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
