"""The analyze job's PNG plots and its one-page `report.md` (from small collected aggregates)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: CI and Spark drivers have no display

import matplotlib.pyplot as plt

PLOTS = {
    "rates": "rates.png",
    "depth": "depth.png",
    "latency_histogram": "latency_histogram.png",
    "redelivery_causes": "redelivery_causes.png",
}


def _save(figure: Any, path: Path) -> str:
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=90)
    plt.close(figure)
    return str(path)


def write_report(out: Path, summary: dict[str, Any], facts: dict[str, Any]) -> dict[str, str]:
    """Write the four plots and report.md under `out`; returns their paths by name."""
    series = facts["series"]
    seconds = [(r["t"] - series[0]["t"]) if series else 0 for r in series]
    written: dict[str, str] = {}
    bucket = facts["bucket_s"]

    figure, axes = plt.subplots(figsize=(9, 4))
    for column in ("published", "delivered", "acked", "returned", "dead_lettered"):
        axes.plot(seconds, [r[column] / bucket for r in series], label=column)
    axes.set_xlabel("seconds since the first command")
    axes.set_ylabel("messages / s (all queues)")
    axes.legend(loc="upper right")
    axes.set_title("Rates over time")
    written["rates_plot"] = _save(figure, out / PLOTS["rates"])

    figure, axes = plt.subplots(figsize=(9, 4))
    axes.plot(seconds, [r["ready_max"] for r in series], label="ready (max of one queue)")
    axes.plot(seconds, [r["checked_out_max"] for r in series], label="checked out (max)")
    axes.set_xlabel("seconds since the first command")
    axes.set_ylabel("messages")
    axes.legend(loc="upper right")
    axes.set_title(f"Depth over time ({bucket} s buckets)")
    written["depth_plot"] = _save(figure, out / PLOTS["depth"])

    figure, axes = plt.subplots(figsize=(9, 4))
    bins = facts["ack_histogram"]
    axes.bar([f"<{2 ** (b + 1)}" for b, _ in bins], [c for _, c in bins], color="tab:blue")
    axes.set_xlabel("publish -> ack latency (ms, log2 bins)")
    axes.set_ylabel("messages")
    axes.set_title("Latency histogram")
    axes.tick_params(axis="x", labelrotation=45)
    written["latency_plot"] = _save(figure, out / PLOTS["latency_histogram"])

    totals = facts["totals"]
    causes = {
        "client return": totals.get("returns", 0),
        "consumer timeout": totals.get("timeouts", 0),
        "consumer down / cancelled": totals.get("consumer_gone", 0),
        "modify": totals.get("modified", 0),
    }
    figure, axes = plt.subplots(figsize=(9, 4))
    axes.bar(list(causes), list(causes.values()), color="tab:orange")
    axes.set_ylabel("redeliveries")
    axes.set_title("Redelivery causes")
    written["causes_plot"] = _save(figure, out / PLOTS["redelivery_causes"])

    report = out / "report.md"
    report.write_text(_markdown(summary, facts, causes))
    written["report"] = str(report)
    return written


def _markdown(summary: dict[str, Any], facts: dict[str, Any], causes: dict[str, int]) -> str:
    totals, outcomes, consumers = facts["totals"], facts["outcomes"], facts["consumers"]
    check = summary["replay_check"]
    checked = "equal to the log's end record" if check.get("equal") else f"NOT verified: {check}"
    lines = [
        f"# Queue analytics: {Path(summary['log']).name}",
        "",
        f"Log: {summary['log_chosen']}. {summary['entries']} entries, {summary['commands']} "
        f"commands, {summary['queues']} queues in {summary['groups']} replay groups; upgrades: "
        f"{summary['upgrades'] or 'none'}. Replayed state digest {checked}.",
        "",
        "| messages | published | acked | dead-lettered | discarded | expired | dropped | still "
        "queued | deliveries | consumers | timeouts | SAC hand-overs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {totals.get('messages', 0)} | {totals.get('published', 0)} | "
        f"{outcomes.get('acked', 0)} | {outcomes.get('dead_lettered', 0)} | "
        f"{outcomes.get('discarded', 0)} | {outcomes.get('expired', 0)} | "
        f"{outcomes.get('dropped', 0)} | {outcomes.get('queued', 0)} | "
        f"{totals.get('deliveries', 0)} | {consumers.get('consumers', 0)} | "
        f"{consumers.get('timeouts', 0)} | {consumers.get('handovers', 0)} |",
        "",
        "Latency (ms) over all queues:",
        "",
        "| measure | count | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|---|",
    ]
    for row in facts["latency"]:
        if row["queue"] == "*":
            lines.append(
                f"| publish -> {row['measure']} | {row['count']} | {row['p50_ms']} | "
                f"{row['p90_ms']} | {row['p99_ms']} | {row['max_ms']} |"
            )
    lines += [
        "",
        "Redeliveries by cause: " + ", ".join(f"{k} {v}" for k, v in causes.items()) + ".",
        "",
        "![rates](rates.png)",
        "![depth](depth.png)",
        "![latency](latency_histogram.png)",
        "![redelivery causes](redelivery_causes.png)",
        "",
        f"Tables (Parquet): {', '.join(Path(p).name for p in summary['outputs'].values())}. "
        f"Analysed in {summary['elapsed_s']} s on {summary['master']}.",
        "",
    ]
    return "\n".join(lines)
