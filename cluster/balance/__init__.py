"""Balancing single-active-consumer queues over applications, pure (no I/O, clock or randomness).

`decision` is the leaderless rule every application runs on its own view; `checker` explores the
rule's model exhaustively; `sticky` is the server-side assignment; `strategies` and `simulator`
feed the rebalance study (`quorumq pipeline rebalance-eval`).
"""
