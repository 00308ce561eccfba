"""Logging for a node: structlog JSON lines in `<node dir>/node.log`, readable console output.

pysyncobj logs through the standard library; those records go to the same two handlers.
node.log is the one log: it rotates by size (`log_file_bytes_max`, keeping `log_files_kept`
older files, node.log.1 the newest of them). The console (stderr) shows every line only when
it is a terminal (`node start` in the foreground); a node started by the launcher writes its
stderr to stderr.log, which then gets only errors (and what the node prints when it cannot
start), so no line is written twice.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path

import structlog
from structlog.typing import Processor

_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class _DropVersionRetries(logging.Filter):
    """pysyncobj logs a version stop on every tick; our own `apply_stopped` says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "unsupported code version" not in record.getMessage()


def setup_logging(
    log_file: Path,
    node_id: str,
    file_bytes_max: int,
    files_kept: int,
) -> None:
    """Route structlog and stdlib logging to `log_file` (JSON lines, rotated past
    `file_bytes_max` with `files_kept` older files) and stderr (see the module docstring)."""
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(node=node_id)
    file_handler = logging.handlers.RotatingFileHandler(
        log_file, maxBytes=file_bytes_max, backupCount=files_kept, encoding="utf-8"
    )
    file_handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if sys.stderr.isatty() else logging.ERROR)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [file_handler, console]
    root.setLevel(logging.INFO)
    logging.getLogger("pysyncobj").addFilter(_DropVersionRetries())
    logging.getLogger("pysyncobj.syncobj").addFilter(_DropVersionRetries())
