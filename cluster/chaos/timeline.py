"""PNG timeline of a chaos run: throughput per second with the fault windows shaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cluster.chaos.availability import FaultWindow, Series, Window

FAULT_COLOURS = {
    "kill": "tab:red",
    "pause": "tab:orange",
    "partition": "tab:purple",
    "restart-all": "tab:brown",
}


def plotting_missing() -> str | None:
    """What to install to draw timelines, or None when matplotlib is there (the `chaos` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "the chaos runner draws its timeline with matplotlib: pip install 'quorumq[chaos]'"
    return None


def plot_timeline(
    series: Series,
    faults: Sequence[FaultWindow],
    unavailable: Sequence[Window],
    path: Path,
    title: str = "quorumq chaos run",
) -> Path:
    """Write the timeline PNG to `path` (matplotlib, Agg backend) and return the path."""
    import matplotlib

    matplotlib.use("Agg")  # no display: the harness runs headless
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, 4.5), dpi=100)
    times = series.times()
    axes.plot(times, series.published, label="publishes confirmed /s", color="tab:blue")
    axes.plot(times, series.consumed, label="acks settled /s", color="tab:green", alpha=0.8)
    axes.bar(
        times,
        series.not_ok,
        width=series.bucket_s,
        label="publishes failed or unknown",
        color="black",
        alpha=0.5,
        align="edge",
    )
    seen: set[str] = set()
    for fault in faults:
        base = fault.kind.removesuffix("-leader")
        label = None if fault.kind in seen else f"fault: {fault.kind}"
        seen.add(fault.kind)
        axes.axvspan(
            fault.start_s,
            fault.end_s,
            color=FAULT_COLOURS.get(base, "tab:gray"),
            alpha=0.18 if base == fault.kind else 0.3,
            label=label,
        )
    for index, window in enumerate(unavailable):
        axes.axvspan(
            window.start_s,
            window.end_s,
            ymin=0.0,
            ymax=0.04,
            color="tab:red",
            label="no confirm (unavailable)" if index == 0 else None,
        )
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("operations per second")
    axes.set_title(title)
    axes.set_xlim(0, max(times[-1] + series.bucket_s if times else 1.0, 1.0))
    axes.legend(loc="upper right", fontsize="small", ncol=2)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
