"""The node binds the submitting connection into settles (issue 31): `bind_owner` gives the
bound form once machine v4 is effective, the unbound one before, and never the client's own
choice of connection."""

from __future__ import annotations

from cluster.node.session import bind_owner
from fifo.commands import (
    BoundModify,
    BoundSettle,
    ConnectionId,
    Credit,
    Modify,
    Settle,
)

MINE = ConnectionId("n1", 7, 3)
FORGED = ConnectionId("n2", 1, 1)


def test_a_settle_is_bound_to_the_submitting_connection_from_v4() -> None:
    """v4: the bound form with our connection; v3: the command unchanged."""
    settle = Settle("q", 5, (1, 2))
    assert bind_owner(settle, MINE, 4) == BoundSettle("q", 5, (1, 2), MINE)
    assert bind_owner(settle, MINE, 3) is settle
    modify = Modify("q", 5, (1,), True, False, (("x", 1),))
    assert bind_owner(modify, MINE, 4) == BoundModify("q", 5, (1,), True, False, (("x", 1),), MINE)


def test_a_forged_connection_is_replaced() -> None:
    """A bound form naming another connection gets ours (v4), or is unbound before v4."""
    forged = BoundSettle("q", 5, (1,), FORGED)
    assert bind_owner(forged, MINE, 4) == BoundSettle("q", 5, (1,), MINE)
    assert bind_owner(forged, MINE, 3) == Settle("q", 5, (1,))
    assert type(bind_owner(forged, MINE, 3)) is Settle


def test_other_commands_are_untouched() -> None:
    """Only the five settling commands are bound."""
    credit = Credit("q", 5, 10, 0)
    assert bind_owner(credit, MINE, 4) is credit
