"""Chaos harness: record a client history under injected faults and check it (Jepsen total-queue).

Modules: `history` (the JSON-lines event format and a thread-safe recorder), `checker`
(total-queue verdicts), `linkproxy` (per-link TCP proxy for partitions), `nemesis` (faults and
a seeded schedule), `run` (workload, run loop, report) and `timeline` (PNG plot).
"""
