"""The client library's loggers: structlog events handed to the standard `logging` module.

A library must not print on the application's stdout, nor decide what is shown: every event
becomes one `logging.LogRecord` of the named logger (`quorumq.client`, `quorumq.workpool`, ...),
whatever structlog configuration the application has. Without any logging configuration, Python
shows WARNING and above on stderr (its last-resort handler); the client logs what needs no
action at INFO or DEBUG, and each event once (a leader change is one record, not one per frame
refused meanwhile). The record's message is `event key=value ...`; `quorumq_event` and
`quorumq_context` (extra attributes) carry the event name and its context for handlers.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

EVENT_ATTRIBUTE = "quorumq_event"
CONTEXT_ATTRIBUTE = "quorumq_context"


def _to_record(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the `logging` call: message text and the extra attributes."""
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    context = dict(event_dict)
    text = " ".join([event, *(f"{key}={value!r}" for key, value in context.items())])
    record = {"msg": text, "extra": {EVENT_ATTRIBUTE: event, CONTEXT_ATTRIBUTE: context}}
    if exc_info:
        record["exc_info"] = exc_info
    return record


def get_logger(name: str) -> Any:
    """A structlog logger that writes to `logging.getLogger(name)` (never to stdout); events
    below that logger's effective level cost one level check."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _to_record],
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
