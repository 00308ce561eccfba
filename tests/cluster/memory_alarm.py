"""A 3-node cluster whose nodes read their resident set from a file the test writes
(`QUORUMQ_TEST_RSS_FILE`), under a low `memory_high_watermark`: the test decides when the
nodes cross it (tests/cluster/test_node_memory_alarm.py, tests/amqp/test_amqp_memory_alarm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import CONFIG_FILE
from cluster.launcher import LocalCluster, init_cluster, start_cluster
from cluster.node.memory import TEST_RSS_ENV

RSS_FILE = "rss.test"
WATERMARK_MIB = 64


def start_alarmable_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalCluster:
    """3 nodes with memory_high_watermark = WATERMARK_MIB, reading their RSS from RSS_FILE."""
    monkeypatch.setenv(TEST_RSS_ENV, RSS_FILE)
    data_dir = tmp_path / "D"
    init_cluster(data_dir, nodes=3)
    toml = data_dir / CONFIG_FILE
    setting = f'memory_high_watermark = "{WATERMARK_MIB}MiB"\n'
    toml.write_text(toml.read_text().replace("[cluster]\n", "[cluster]\n" + setting))
    return start_cluster(data_dir, nodes=3)


def set_resident(cluster: LocalCluster, mib: int) -> None:
    """Every node reads `mib` MiB as its resident set from now on."""
    for node in cluster.config.nodes:
        (node.data_dir / RSS_FILE).write_text(str(mib * 1024 * 1024))
