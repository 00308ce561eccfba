"""RabbitMQ's dead-letter headers on a message the machine dead-lettered.

The machine annotates a dead letter with why and from which queue (`x-death-reason`,
`x-death-queue`, `fifo.shared.DEATH_KEYS`); the properties stored with it are those it was
published with. A delivery of such a message gets what RabbitMQ adds: an `x-death` entry (count,
reason, queue, exchange, routing-keys, and `original-expiration`, the `expiration` property it
loses) first in the list, and `x-first-death-reason` / `-queue` / `-exchange` when not set.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from fifo.shared import DEATH_KEYS

REASON_KEY, QUEUE_KEY = DEATH_KEYS
DEATHS_KEPT = 16  # entries of an x-death list a client published (more are dropped)


def death_of(annotations: tuple[tuple[str, str | int], ...]) -> tuple[str, str] | None:
    """(reason, source queue) of a dead-lettered message, None for any other."""
    table = dict(annotations)
    reason, queue = table.get(REASON_KEY), table.get(QUEUE_KEY)
    if reason is None or queue is None:
        return None
    return str(reason), str(queue)


def add_death(
    properties: commands.Basic.Properties, death: tuple[str, str], route: tuple[str, str] | None
) -> None:
    """Add RabbitMQ's x-death headers to `properties` (in place). `route` is the exchange and
    key the message was published with (None: the default exchange, the source queue's name)."""
    reason, queue = death
    exchange, key = route or ("", queue)
    headers: dict[str, Any] = dict(properties.headers or {})
    earlier = headers.get("x-death")
    entries = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
    same = [e for e in entries if (e.get("queue"), e.get("reason")) == (queue, reason)]
    count = same[0].get("count", 0) if same else 0
    entry: dict[str, Any] = {
        "count": (count if isinstance(count, int) else 0) + 1, "reason": reason,
        "queue": queue, "exchange": exchange, "routing-keys": [key],
    }  # fmt: skip
    if properties.expiration is not None:
        entry["original-expiration"] = properties.expiration
        properties.expiration = None
    rest = [e for e in entries if not any(e is s for s in same)]
    headers["x-death"] = [entry, *rest[: DEATHS_KEPT - 1]]
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", exchange)
    properties.headers = headers
