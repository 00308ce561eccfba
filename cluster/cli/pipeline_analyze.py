"""`quorumq pipeline analyze`: queue analytics from an exported log, on Spark."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cluster.cli.exits import CANT_CREATE, DATA, UNAVAILABLE, USAGE, CliError


class TimeType(click.ParamType[int, Any]):
    """An ISO 8601 time (UTC unless it says otherwise) or epoch milliseconds."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            self.fail(f"{text!r} is neither ISO 8601 nor epoch milliseconds", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)


@click.command("analyze")
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path),
    required=True,
    help="A `quorumq log export` file, or a directory of exports of the same cluster's nodes "
    "(the one with the highest commit index is used; the job says which).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Output directory (shared by every executor on a cluster).",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--from", "from_time", type=TimeType(), default=None, help="Window start.")
@click.option("--to", "to_time", type=TimeType(), default=None, help="Window end (exclusive).")
@click.option(
    "--chunk-mib",
    type=click.IntRange(min=1, max=1024),
    default=16,
    show_default=True,
    help="Bytes of log per parse task.",
)
@click.pass_context
def analyze(
    ctx: click.Context,
    log_path: Path,
    out_dir: Path,
    master: str,
    from_time: int | None,
    to_time: int | None,
    chunk_mib: int,
) -> None:
    """Replay an exported log through the machine on Spark and write queue analytics.

    Each queue's commands (queues linked by dead-lettering together) are replayed in index
    order with the machine version recorded in the log, so every fact is the machine's own.
    Writes messages, queue_rates, consumers and latency Parquet tables, four PNG plots,
    report.md and summary.json under --out. --from/--to restrict the rows to a time window
    (the replay still starts at the beginning). Progress goes to stderr.

    \b
    Example:
      quorumq log export --data-dir /tmp/qq --node n1 --out /tmp/n1.log
      quorumq pipeline analyze --log /tmp/n1.log --out /tmp/analytics --master 'local[2]'
    """
    from cluster.cli.machine import nothing_to_check
    from pipeline.logscan import EmptyLog, LogScanError, log_files, pick_log

    if from_time is not None and to_time is not None and from_time >= to_time:
        raise CliError("--from must be before --to", USAGE)
    try:
        chosen, because = pick_log(log_files(log_path))
    except EmptyLog as err:
        raise CliError(nothing_to_check(str(err), "the analysis"), DATA) from err
    except LogScanError as err:
        raise CliError(str(err), USAGE) from err
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"cannot create --out {out_dir}: {err}", CANT_CREATE) from err
    summary = _run(chosen, because, out_dir, master, (from_time, to_time), chunk_mib)
    output = ctx.obj.output if ctx.obj else "table"
    if output in ("json", "jsonl"):
        click.echo(json.dumps(summary, sort_keys=True, indent=None if output == "jsonl" else 2))
        return
    totals, outcomes = summary["totals"], summary["outcomes"]
    check = summary["replay_check"]
    click.echo(
        f"{summary['commands']} commands, {totals.get('messages', 0)} messages "
        f"({outcomes.get('acked', 0)} acked, {outcomes.get('dead_lettered', 0)} dead-lettered), "
        f"{summary['queues']} queues in {summary['elapsed_s']} s on {summary['master']}; "
        f"replay {'matches' if check.get('equal') else 'NOT checked against'} the log's digest"
    )
    for name, path in summary["outputs"].items():
        click.echo(f"{name}: {path}")


def _run(
    log: Path,
    because: str,
    out_dir: Path,
    master: str,
    window: tuple[int | None, int | None],
    chunk_mib: int,
) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from pipeline.analyze import AnalyzeConfig, run_analysis
    from pipeline.logscan import LogScanError
    from pipeline.spark import create_session

    owned = SparkSession.getActiveSession() is None
    click.echo(f"starting spark on {master}", err=True)
    try:
        spark = create_session(master, app_name="quorumq-analyze")
    except Exception as err:  # py4j and the launcher raise several unrelated types
        raise CliError(f"cannot start spark on {master}: {err}", UNAVAILABLE) from err
    try:
        config = AnalyzeConfig(log, out_dir, because, window, chunk_mib * 1024 * 1024)
        return run_analysis(spark, config, progress=sys.stderr)
    except LogScanError as err:
        raise CliError(str(err), USAGE) from err
    finally:
        if owned:
            spark.stop()
