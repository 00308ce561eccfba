"""Issue 28, acceptance 1: the web UI in headless Debian Chromium (Selenium, chromium-driver)
on a real 3-node cluster: three nodes and the leader on the overview; after 500 publishes the
queue's page shows depth 500 and a non-zero publish rate in its chart; a purge through the UI
empties it; a consumer group's page shows the assignment move when a member is killed; a killed
node turns red on the overview within 5 s. Screenshots go to $QUORUMQ_SCREENSHOTS (or a tmp
dir)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from cluster.client.groups import declare_partitioned_queue
from cluster.launcher import LocalCluster
from tests.management.helpers import admin_auth, base_url, http, screenshot_dir

pytestmark = pytest.mark.cluster

T = TypeVar("T")
UI_NODE = "n1"
PUBLISHES = 500
PARTITIONS = 4
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1000",
)  # fmt: skip
MEMBER = """
import sys, time
from pathlib import Path
from cluster.client import Client
from cluster.client.groups import join_group
with Client.from_data_dir(Path(sys.argv[1]), name=sys.argv[2]) as client:
    member = join_group(client, "billing", "orders", member=sys.argv[2], prefetch=5)
    for message in member:
        message.ack()
"""


@pytest.fixture
def browser(chromium: tuple[str, str], tmp_path: Path) -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, driven by Debian's chromedriver."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium[0]
    profile = tmp_path / "chromium-profile"  # fresh for each test
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromium[1]), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait(predicate: Callable[[], T | Literal[False] | None], timeout_s: float, what: str) -> T:
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            found = predicate()
        except Exception as err:  # the page re-renders between two lookups
            last = err
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout_s} s (last: {last!r})")


def text_of(driver: WebDriver, css: str) -> str:
    """The text of the first element matching `css` ('' when there is none)."""
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return str(found[0].text) if found else ""


def log_in(driver: WebDriver, cluster: LocalCluster) -> None:
    driver.get(base_url(cluster, UI_NODE) + "/")
    password = wait(lambda: driver.find_element(By.ID, "login-password"), 10, "the login form")
    password.send_keys(admin_auth(cluster)[1])
    driver.find_element(By.ID, "login-submit").click()
    wait(lambda: text_of(driver, "#who").startswith("admin (admin)"), 10, "the logged-in user")


def overview_has_three_nodes_and_the_leader(driver: WebDriver, cluster: LocalCluster) -> None:
    leader = cluster.leader()
    wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#nodes-table tr.node-up")) == 3,
         10, "three nodes up")  # fmt: skip
    wait(lambda: text_of(driver, f'#nodes-table tr[data-node="{leader}"] td.role') == "leader",
         10, f"{leader} shown as leader")  # fmt: skip
    assert text_of(driver, "#leader") == leader


def publish(cluster: LocalCluster, queue: str, count: int) -> None:
    with cluster.client(UI_NODE, only=True) as client:
        client.declare_queue(queue)
        with client.publisher(queue, window=100) as publisher:
            for n in range(count):
                publisher.publish(f"job {n}".encode())
            publisher.wait_for_confirms(60.0)


def start_members(cluster: LocalCluster, names: list[str]) -> dict[str, subprocess.Popen[bytes]]:
    members = {}
    for name in names:
        members[name] = subprocess.Popen(
            [sys.executable, "-c", MEMBER, str(cluster.data_dir), name],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    return members


def partition_members(driver: WebDriver) -> dict[str, str]:
    """Partition -> member as the consumer group's page shows it; {} during a hand-over."""
    if "pending" in text_of(driver, "#partitions-table"):
        return {}
    rows = driver.find_elements(By.CSS_SELECTOR, "#partitions-table tr[data-partition]")
    return {
        str(row.get_attribute("data-partition")): str(
            row.find_element(By.CSS_SELECTOR, "td.member").text
        )
        for row in rows
    }


@pytest.mark.timeout(240)
def test_the_ui_shows_the_cluster_live_and_acts_on_it(
    mgmt_cluster: LocalCluster, browser: WebDriver, tmp_path: Path
) -> None:
    """The whole operator's tour in one browser session (see the module docstring)."""
    driver = browser
    shots = screenshot_dir(tmp_path)
    log_in(driver, mgmt_cluster)
    overview_has_three_nodes_and_the_leader(driver, mgmt_cluster)
    driver.save_screenshot(str(shots / "overview.png"))

    publish(mgmt_cluster, "jobs", PUBLISHES)
    driver.get(base_url(mgmt_cluster, UI_NODE) + "/#/queue/jobs")
    wait(lambda: text_of(driver, "#queue-depth") == str(PUBLISHES), 10, "depth 500")
    rate = '#chart-queue-rates [data-series="publish_rate"] .value'
    no_rate = ("", "\N{EN DASH}", "0")
    wait(lambda: text_of(driver, rate) not in no_rate, 20, "a non-zero publish rate")
    driver.save_screenshot(str(shots / "queue.png"))
    driver.find_element(By.ID, "purge-button").click()
    driver.find_element(By.ID, "purge-confirm").click()
    wait(lambda: text_of(driver, "#action-result") == f"purged {PUBLISHES}", 10, "purge answer")
    wait(lambda: text_of(driver, "#queue-depth") == "0", 10, "depth 0 after the purge")

    with mgmt_cluster.client(UI_NODE, only=True) as client:
        declare_partitioned_queue(client, "orders", PARTITIONS)
    members = start_members(mgmt_cluster, ["alpha", "beta"])
    try:
        driver.get(base_url(mgmt_cluster, UI_NODE) + "/#/consumer-group/billing")
        before: dict[str, str] = wait(
            lambda: (found := partition_members(driver)) and
            sorted(found.values()) == ["alpha", "alpha", "beta", "beta"] and found,
            60, "2/2 assignment")  # fmt: skip
        driver.save_screenshot(str(shots / "consumer-group-before.png"))
        members["beta"].send_signal(signal.SIGKILL)
        after = wait(lambda: (found := partition_members(driver)) and
                     set(found.values()) == {"alpha"} and found,
                     30, "beta's partitions moved")  # fmt: skip
        moved = sorted(p for p, member in before.items() if member == "beta")
        listed = wait(lambda: (text := text_of(driver, "#rebalances-table")) and
                      all(f"{p}: beta → alpha" in text for p in moved) and text,
                      10, "the rebalance listed with what it moved")  # fmt: skip
        print(listed)
        assert after == dict.fromkeys(before, "alpha")
        driver.save_screenshot(str(shots / "consumer-group-after.png"))
    finally:
        for process in members.values():
            process.kill()
            process.wait(10)

    driver.get(base_url(mgmt_cluster, UI_NODE) + "/#/")
    overview_has_three_nodes_and_the_leader(driver, mgmt_cluster)
    victim = next(n for n in ("n2", "n3") if n != mgmt_cluster.leader())
    mgmt_cluster.kill(victim)
    killed_at = time.monotonic()
    wait(lambda: "node-down" in str(driver.find_element(
        By.CSS_SELECTOR, f'#nodes-table tr[data-node="{victim}"]').get_attribute("class")),
        5.0, f"{victim} red")  # fmt: skip
    print(f"{victim} red on the overview {time.monotonic() - killed_at:.2f} s after its kill")
    driver.save_screenshot(str(shots / "overview-node-down.png"))
    mgmt_cluster.start_node(victim)  # the session's other tests get their three nodes back
    back = base_url(mgmt_cluster, victim) + "/api/overview"
    wait(lambda: http(back, auth=admin_auth(mgmt_cluster))[0] == 200, 30, f"{victim} back")
    wait(lambda: "node-up" in str(driver.find_element(
        By.CSS_SELECTOR, f'#nodes-table tr[data-node="{victim}"]').get_attribute("class")),
        30, f"{victim} green again")  # fmt: skip
