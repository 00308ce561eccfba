"""Plugins of the whole test tree: no test leaves a thread running behind it
(`tests/thread_guard.py`), and `pytester` for the test of that guard."""

from __future__ import annotations

pytest_plugins = ["pytester", "tests.thread_guard"]
