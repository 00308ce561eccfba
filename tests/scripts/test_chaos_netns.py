"""`scripts/chaos.py --netns`: refused with its reason, before anything starts, where it
cannot run (here: a power-loss fault, which namespaces cannot inject)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_netns_refuses_power_loss_before_starting_anything(tmp_path: Path) -> None:
    """Exit 69 with the reason on stderr, and no history written."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--netns", "--faults",
         "kill,power-loss", "--duration", "10", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 69, done.stderr
    assert "--netns" in done.stderr and "power-loss" in done.stderr
    assert not (tmp_path / "out" / "history.jsonl").exists()
