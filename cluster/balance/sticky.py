"""The sticky assignment, as machine v3 computes it (`fifo.v3.sticky`), for the rebalance study."""

from __future__ import annotations

from fifo.v3.sticky import assign, moves, moves_lower_bound

__all__ = ["assign", "moves", "moves_lower_bound"]
