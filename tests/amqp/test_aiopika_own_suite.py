"""aio-pika's own tests (from its sdist, unchanged) against a real 3-node cluster, through
scripts/run_aiopika_suite.py: a slice of their suite that applies to quorum queues must pass
whole, and the script's classification must count it (issue 27, acceptance item 3).

The whole suite is run by hand (`python scripts/run_aiopika_suite.py --json out.json`); its
per-module results are in docs/amqp.md. The first run downloads aio-pika's sdist and builds a
virtualenv with its test dependencies under ~/.cache/quorumq (about 20 s, needs the package
index); later runs reuse them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_aiopika_suite.py"
# their tests that talk to the broker and apply to quorum queues (basic.return with confirms,
# properties, channel close by the broker, a consumer without acks, wrong credentials), each with
# aio_pika.connect and connect_robust: every one must pass
MODULE = "tests/test_amqp.py"
SLICE = (
    f"{MODULE}::TestCaseAmqpWithConfirms::test_basic_return",
    f"{MODULE}::TestCaseAmqp::test_on_return_raises",
    f"{MODULE}::TestCaseAmqp::test_properties",
    f"{MODULE}::TestCaseAmqp::test_unexpected_channel_close",
    f"{MODULE}::TestCaseAmqp::test_queue_iterator_close_with_noack",
    f"{MODULE}::TestCaseAmqp::test_wrong_credentials",
)
TIMEOUT_S = 600


@pytest.mark.cluster
def test_a_slice_of_aiopikas_suite_passes_whole(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    command = [
        sys.executable, str(SCRIPT), "--json", str(summary_path), "--min-pass-rate", "1.0",
        *SLICE,
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert summary_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    totals = summary["totals"]
    assert run.returncode == 0, (summary["problems"], run.stdout[-3000:])
    assert totals == {**totals, "failed": 0, "passed": 2 * len(SLICE), "tests": 2 * len(SLICE)}
    assert set(summary["modules"]) == {MODULE}, summary["modules"].keys()
