"""PNG plots of campaign results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: the pipeline runs headless, on CI and on Spark drivers

import matplotlib.pyplot as plt

NO_UPGRADE_LABEL = "no upgrade"


def plot_upgrade_profile(profile: Sequence[Any], title: str, path: Path) -> Path:
    """Plot mean/max final queue depth and violations by upgrade index; write a PNG to `path`.

    `profile` holds UPGRADE_PROFILE_SCHEMA rows (upgrade_index -1 means no upgrade).
    """
    indexes = [row["upgrade_index"] for row in profile]
    figure, (depth_axes, violation_axes) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    depth_axes.plot(indexes, [row["mean_ready"] or 0.0 for row in profile], ".", label="mean")
    depth_axes.plot(indexes, [row["max_ready"] or 0 for row in profile], "x", label="max")
    depth_axes.set_ylabel("final queue depth (ready)")
    depth_axes.legend(loc="upper right")
    violations = [row["violations"] for row in profile]
    violation_axes.bar(indexes, violations, color="tab:red")
    violation_axes.set_ylim(0, max([1, *violations]) * 1.1)  # a clean run shows an empty 0..1 axis
    violation_axes.set_ylabel("violations")
    violation_axes.set_xlabel(f"upgrade index (-1 = {NO_UPGRADE_LABEL})")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
    return path
