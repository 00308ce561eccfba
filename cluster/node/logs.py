"""Logging for a node: structlog JSON lines in `<node dir>/node.log`, readable console output.

pysyncobj logs through the standard library; those records go to the same two handlers.
"""

from __future__ import annotations

import logging
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


def setup_logging(log_file: Path, node_id: str, console_level: int = logging.INFO) -> None:
    """Route structlog and stdlib logging to `log_file` (JSON lines) and stderr (console)."""
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(node=node_id)
    file_handler = logging.FileHandler(log_file, encoding="utf-8")
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
    console.setLevel(console_level)
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
