"""Fixtures of the management tests: a 3-node cluster serving the API (with a read-only user),
HTTP helpers, and headless Chromium from Debian packages (installed here when missing)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from cluster import config as cluster_config
from cluster.config import UserConfig
from cluster.launcher import LocalCluster, init_cluster, start_cluster
from cluster.management.passwords import hash_password
from tests.cluster.client_cluster import on_latest_machine
from tests.management.helpers import VIEWER

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
APT_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def mgmt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 nodes with http ports and a read-only user `viewer`, shared by the API and browser
    tests (the browser test restarts the node it kills); stopped at the end of the session."""
    data_dir = tmp_path_factory.mktemp("mgmt") / "D"
    config = init_cluster(data_dir, 3, http_base_port=0)
    viewer = UserConfig(VIEWER[0], hash_password(VIEWER[1]), "read")
    cluster_config.write(data_dir, dataclasses.replace(config, users=(viewer,)))
    cluster = start_cluster(data_dir, 3)
    try:
        yield on_latest_machine(cluster)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Debian's chromium and chromium-driver, installed with apt-get when missing (we are root
    on a fresh machine); fails, never skips, when they cannot be had."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.fail(
                f"{CHROMIUM} and {CHROMEDRIVER} are missing and cannot be installed "
                "here (needs root and apt-get): apt-get install chromium chromium-driver"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"],
        ):
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=APT_TIMEOUT_S)  # fmt: skip
            if done.returncode != 0:
                failed = " ".join(command)
                pytest.fail(f"{failed} failed ({done.returncode}): {done.stderr[-2000:]}")
    return CHROMIUM, CHROMEDRIVER
