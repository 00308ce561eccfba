"""The status digest is bounded: it encodes the whole state on the node's loop.

Before, every `status` query (`cluster status`, the launcher's polls) encoded the state: 200,000
messages held stalled the node 0.36 s, and at a million a status query would stall it past the
election timeout (the followers would elect another leader). Real node processes.
"""

from __future__ import annotations

import json

import pytest

from cluster.launcher import LocalCluster, wait_until
from raft.node import DIGEST_MESSAGES_MAX
from tests.cluster.conftest import quorumq_cli

pytestmark = pytest.mark.cluster


def test_status_leaves_the_digest_out_above_the_bound_unless_asked(cluster3: LocalCluster) -> None:
    held = DIGEST_MESSAGES_MAX + 1
    with cluster3.client() as client:
        client.declare_queue("held")
        with client.publisher("held", window=1000) as publisher:
            publisher.publish_many((b"x" for _ in range(held)), timeout_s=120.0)
            publisher.wait_for_confirms(timeout_s=120.0)
        status = client.status()
        assert status["digest"] is None
        assert f"{held} messages held" in str(status["digest_skipped"])
        forced = client.status(digest=True)
        assert isinstance(forced["digest"], str) and "digest_skipped" not in forced

    data_dir = str(cluster3.data_dir)
    plain = quorumq_cli("--data-dir", data_dir, "-o", "json", "cluster", "status")
    assert plain.returncode == 0, plain.stderr
    assert all(row["digest"] is None for row in json.loads(plain.stdout))

    def forced_rows() -> list[dict[str, object]] | None:
        result = quorumq_cli("--data-dir", data_dir, "-o", "json", "cluster", "status", "--digest")
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, object]] = json.loads(result.stdout)
        applied = {row["last_applied"] for row in rows}
        return rows if len(applied) == 1 else None

    rows = wait_until(forced_rows, 30, "every node at the same applied index")
    digests = {row["digest"] for row in rows}
    assert len(digests) == 1 and isinstance(digests.pop(), str)
