"""Which of aio-pika's own tests apply to quorumq's quorum queues, and why the others do not.

A test that passes is counted as passed, whatever it uses. A test that fails is "not applicable"
only when its failure (the whole report: message and traceback) carries one of quorumq's own
refusals of a feature quorum queues do not have (RabbitMQ's quorum queues refuse them too), and
"needs exchanges" when it carries the refusal of a named exchange by a cluster before machine v4
(`run_aiopika_suite.py --machine-version 4` runs them). Every other failure counts against the
pass rate and is explained in docs/amqp.md.
"""

from __future__ import annotations

import re

NOT_APPLICABLE = "not_applicable"
NEEDS_EXCHANGES = "needs_exchanges"

# (what the failure report contains, verdict, why); first match wins
RULES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), verdict, why)
    for pattern, verdict, why in (
        (r"an (auto-delete|exclusive|non-durable) queue \(every quorumq queue",
         NOT_APPLICABLE, "declares an exclusive or auto-delete queue (a quorum queue is neither)"),
        (r"invalid property '(auto-delete|exclusive|non-durable)' for queue",
         NOT_APPLICABLE, "declares an exclusive, auto-delete or non-durable quorum queue"),
        (r"NOT_IMPLEMENTED - transactions", NOT_APPLICABLE, "transactions (tx.*)"),
        (r"does not support global qos", NOT_APPLICABLE,
         "global basic.qos (quorum queues refuse it at basic.consume)"),
        (r"x-max-priority", NOT_APPLICABLE, "priority queues"),
        (r"x-queue-type '(classic|stream)'", NOT_APPLICABLE, "classic or stream queues"),
        (r"basic\.recover with requeue=false", NOT_APPLICABLE, "basic.recover requeue=false"),
        (r"'QuorumqNode' object has no attribute '_request'", NOT_APPLICABLE,
         "restarts RabbitMQ inside its Docker container (rabbitmqctl stop_app, docker exec)"),
        (r"'QuorumqNode' object has no attribute 'start'", NOT_APPLICABLE,
         "kills RabbitMQ's Docker container and starts it again (docker kill, docker start)"),
        (r"(exchange\.\w+|exchange '[^']*'|binding to exchange|exchanges other than)"
         r".{0,200}not implemented by quorumq", NEEDS_EXCHANGES,
         "a named exchange: machine v4 (--machine-version 4)"),
    )
)  # fmt: skip

# tests that must pass whatever the pass rate (the slice tests/amqp runs keeps them honest)
MUST_PASS: tuple[str, ...] = ()


def classify(test: str, outcome: str, report: str = "") -> tuple[str, str]:
    """(verdict, why) for one test: passed, skipped, failed, not applicable or needs exchanges."""
    if outcome in ("passed", "skipped"):
        return outcome, ""
    for pattern, verdict, why in RULES:
        if pattern.search(report):
            return verdict, why
    return "failed", ""


def must_pass(test: str) -> bool:
    """Whether `test` (a pytest node id, parameters included) is one that must pass."""
    return any(test == name or test.startswith(name + "[") for name in MUST_PASS)
