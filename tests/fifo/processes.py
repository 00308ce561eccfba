"""Run several Python subprocesses at once (the hash-seed checks start one interpreter per
PYTHONHASHSEED; run one after another they left one of the two cores idle)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def run_pythons(
    runs: Sequence[tuple[Sequence[str], str]], timeout_s: float
) -> list[subprocess.CompletedProcess[str]]:
    """Start `python ARGS` with PYTHONHASHSEED=SEED for every (ARGS, SEED) of `runs` at once, in
    the checkout, and wait for each in turn, up to `timeout_s` (TimeoutExpired; then every one
    still running is killed); their results in the order of `runs`."""
    procs = [_start(args, seed) for args, seed in runs]
    try:
        return [_finish(proc, timeout_s) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start(args: Sequence[str], seed: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    pipe = subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, stdout=pipe, stderr=pipe, text=True
    )


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
