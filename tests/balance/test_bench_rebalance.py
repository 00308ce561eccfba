"""scripts/bench_rebalance.py: its small grid runs, and its metrics tell the strategies apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_rebalance.py"


def test_the_quick_grid_reports_sticky_at_the_bound_and_the_baselines_above_it(
    tmp_path: Path,
) -> None:
    """Sticky: balance degree <= 0.5 and moves == lower bound in every scenario; RocketMQ's
    average strategies move more than the bound, consistent hashing is unbalanced; a PNG and a
    results file with one row per (strategy, scenario) are written."""
    out = tmp_path / "bench_rebalance.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--repeat", "5", "--out", str(out)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    printed = json.loads(done.stdout)
    assert printed["acceptance"]["sticky_balance_std_max_le_0_5"]
    assert printed["acceptance"]["sticky_moves_equal_lower_bound_every_step"]
    summary = printed["summary"]
    assert summary["sticky"]["excess_moves"] == 0 and summary["sticky"]["moves"] > 0
    assert summary["average"]["excess_moves"] > 0
    assert summary["average_by_circle"]["excess_moves"] > summary["average"]["excess_moves"]
    assert summary["consistent_hash"]["balance_std_max"] > 0.5
    assert summary["sticky"]["stickiness_mean"] > summary["average"]["stickiness_mean"]
    saved = json.loads(out.read_text())
    assert len(saved["rows"]) == 4 * summary["sticky"]["scenarios"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = printed["target_join"]
    assert target["moves"] == target["moves_lower_bound"] == 256 // 64
    assert target["machine_apply_ms_median"] > 0  # machine v3 applied the JoinGroup
