"""scripts/bench_fifo.py at machine v4 (bodies stay in the log, issue 32): its mixes see v4's
deliveries by reference, and its memory figure adds no body the state does not hold."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_fifo.py"
MESSAGES = 3_000


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fifo_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", [3, 4])
def test_the_steady_mix_settles_every_delivery_at_v3_and_v4(
    bench: ModuleType, version: int
) -> None:
    figure = bench.steady_mix(version, MESSAGES)
    assert figure["commands"] == 2 * MESSAGES  # one enqueue and one settle per message
    assert figure["left_total"] == 0


def test_the_v4_memory_figure_holds_no_body_and_v3_holds_one_per_message(
    bench: ModuleType,
) -> None:
    v3 = bench.memory_per_ready_message(3, MESSAGES)
    v4 = bench.memory_per_ready_message(4, MESSAGES)
    body = sys.getsizeof(bench.BODY)
    assert v3["bodies_in_state"] == MESSAGES and v4["bodies_in_state"] == 0
    assert v4["bodies_in_log"] == MESSAGES and v3["bodies_in_log"] == 0
    assert v3["bytes_per_ready_message"] == round(v3["overhead_bytes_per_ready_message"] + body, 1)
    assert v4["bytes_per_ready_message"] == v4["overhead_bytes_per_ready_message"]
    assert v4["bytes_per_ready_message"] < 130 < v3["bytes_per_ready_message"]
