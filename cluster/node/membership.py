"""The admin actions `member_add` / `member_remove`: checked here, then through the Raft log.

The request names one node; the change appended carries the whole member set after it (ids with
raft and client addresses: the replicated set's addresses once a change recorded them, before
that cluster.toml's). Only the leader appends a change; what only the leader can check at the
moment it appends (another change in flight, a quorum left, a duplicate) is checked there, in
a raft tick (raft/node.py), and comes back as a `Refusal`.

Before that, the node refuses (unless the request says `force`) the two mistakes that leave a
healthy cluster unable to lose a node: adding a member while another member does not answer
(an earlier `member add` whose node never started: each such member raises the quorum without
adding a voter), and removing an answering member when the members left could not lose one.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from cluster import protocol
from fifo.replies import Error
from raft.membership import (
    NODE_ID,
    Member,
    MemberChange,
    MembershipError,
    Refusal,
    check_address,
    check_members,
    plain_members,
)

if TYPE_CHECKING:
    from cluster.node.server import NodeServer
    from cluster.node.session import ClientSession

log = structlog.get_logger("cluster.node.membership")

CHANGE_TIMEOUT_S = 30.0  # the caller hears back within this, whatever happens to the change


def current_members(session: ClientSession) -> dict[str, Member]:
    """The applied member set with addresses (cluster.toml's for members no change recorded)."""
    server = session.server
    configured = {
        node.id: Member(node.id, node.raft_address, node.client_address)
        for node in server.cluster.nodes
    }
    members: dict[str, Member] = {}
    for row in server.replica.members():
        node_id = str(row["id"])
        if row["raft"] and row["client"]:
            members[node_id] = Member(node_id, str(row["raft"]), str(row["client"]))
        elif node_id in configured:
            members[node_id] = configured[node_id]
        else:
            raise MembershipError(f"the addresses of member {node_id} are unknown here")
    return members


def member_endpoints(server: NodeServer) -> dict[str, str]:
    """Each applied member's client address by node id, as the replicated member set records it
    (cluster.toml's for members no change recorded; a member known by neither is left out).

    This, not cluster.toml, is how a node names the leader to clients (welcome, status
    `leader_address`, the not-leader refusal): a node's cluster.toml was read when it started
    and does not name a member added since on another host. Empty before the first apply:
    then cluster.toml's endpoints."""
    configured = server.endpoints
    found: dict[str, str] = {}
    for row in server.replica.members():
        node_id = str(row["id"])
        address = row["client"] or configured.get(node_id)
        if address:
            found[node_id] = str(address)
    return found or dict(configured)


def requested_change(session: ClientSession, action: str, args: Any) -> MemberChange:
    """The change an admin request asks for; MembershipError (the message says why)."""
    if not isinstance(args, dict) or not isinstance(args.get("node"), str):
        raise MembershipError("argument 'node' (a node id) is required")
    node = str(args["node"])
    if not NODE_ID.match(node):
        raise MembershipError(f"bad node id {node!r}: letters, digits, '-' and '_' only")
    members = current_members(session)
    if action == "member_add":
        raft, client = args.get("raft_address"), args.get("client_address")
        if not isinstance(raft, str) or not isinstance(client, str):
            raise MembershipError("arguments 'raft_address' and 'client_address' are required")
        check_address(raft, "raft address")
        check_address(client, "client address")
        if node in members:
            raise MembershipError(f"{node} is already a member")
        for member in members.values():
            for address in (raft, client):
                if address in (member.raft, member.client):
                    raise MembershipError(f"{member.id} already uses {address}")
        after = (*members.values(), Member(node, raft, client))
        change = MemberChange("add", node, raft, tuple(sorted(after)))
    else:
        if node not in members:
            raise MembershipError(f"{node} is not a member (members: {', '.join(sorted(members))})")
        if len(members) == 1:
            raise MembershipError(f"{node} is the last member: a cluster cannot remove it")
        after = tuple(sorted(m for m in members.values() if m.id != node))
        change = MemberChange("remove", node, members[node].raft, after)
    check_members(change.members)
    return change


def tolerance_refusal(session: ClientSession, change: MemberChange) -> str | None:
    """Why `change` would leave the cluster unable to lose a node (see the module docstring),
    judged from the members this node hears from now; None when it would not (or when it is
    raft's no-quorum refusal to make, in the tick)."""
    server = session.server
    members = list(current_members(session))
    answering = {
        node for node in members
        if node == server.node_id or server.replica.peer_connected(node)
    }  # fmt: skip
    if change.op == "add":
        silent = sorted(set(members) - answering)
        if not silent or len(answering) < (len(members) + 1) // 2 + 1:
            return None
        return (
            f"{', '.join(silent)} {'is a member' if len(silent) == 1 else 'are members'} but "
            "does not answer (never started, or down): each silent member raises the quorum "
            f"without adding a voter; start it (`node start`) or `member remove` it before "
            "adding another member, or pass --force"
        )
    left = answering - {change.node}
    before = len(answering) - (len(members) // 2 + 1)
    after = len(left) - ((len(members) - 1) // 2 + 1)
    if after >= 1 or after >= before:
        return None
    return (
        f"after removing {change.node} the cluster could not lose another member "
        f"({len(left)} of {len(members) - 1} would answer, {(len(members) - 1) // 2 + 1} are "
        "needed): add its replacement first (`member add`, `node start`), or pass --force"
    )


def refused(
    message: str,
    unavailable: bool = False,
    leader: str | None = None,
    leader_address: str | None = None,
) -> dict[str, Any]:
    """The result of a change that was not made (a result, not an error frame: clients retry
    `unavailable` errors on their own until they time out, and the caller must hear why at
    once); `unavailable`: it may succeed later unchanged; `leader`, `leader_address`: the
    leader to ask instead (its client address from the replicated member set)."""
    result: dict[str, Any] = {"changed": False, "refused": message, "unavailable": unavailable}
    if leader is not None:
        result["leader"] = leader
    if leader_address is not None:
        result["leader_address"] = leader_address
    return result


def handle_member_admin(session: ClientSession, request_id: int, action: str, args: Any) -> None:
    """Answer a `member_add` / `member_remove` admin request (loop thread)."""
    replica = session.server.replica

    def reply(result: dict[str, Any]) -> None:
        session.send(protocol.result(request_id, result))

    try:
        change = requested_change(session, action, args)
    except MembershipError as err:
        reply(refused(str(err)))
        return
    if replica.role() != "leader":
        leader = replica.leader_id()
        if leader is None:
            reply(refused("no leader: the cluster has no quorum", unavailable=True))
        else:
            address = member_endpoints(session.server).get(leader)
            at = f" at {address}" if address else ""
            reply(refused(f"this node is not the leader ({leader}{at} is)", True, leader, address))
        return
    mistake = None if args.get("force") is True else tolerance_refusal(session, change)
    if mistake is not None:
        reply(refused(mistake))
        return
    if change.op == "remove" and change.node == session.server.node_id:
        replica.transfer_leadership()
        message = (
            f"{change.node} leads the cluster and cannot remove itself: it is handing "
            "leadership to another member now; run the command again in a few seconds"
        )
        reply(refused(message, unavailable=True))
        return
    _propose(session, request_id, change)


def _propose(session: ClientSession, request_id: int, change: MemberChange) -> None:
    answered = False

    def answer(outcome: Any, refusal: Refusal | None) -> None:
        nonlocal answered
        if answered:
            return
        answered = True
        timer.cancel()
        if refusal is not None:
            result = refused(refusal.message, refusal.unavailable)
        elif isinstance(outcome, Error):
            result = refused(outcome.message)
        else:
            log.info("member_changed", op=change.op, node=change.node)
            members = plain_members(change.members)
            result = {"changed": True, "op": change.op, "node": change.node, "members": members}
        session.send(protocol.result(request_id, result))

    def expired() -> None:
        message = (
            f"no outcome within {CHANGE_TIMEOUT_S:.0f}s: the change may still be applied; "
            "check `quorumq member list`"
        )
        answer(None, Refusal(message, unavailable=True))

    timer = asyncio.get_running_loop().call_later(CHANGE_TIMEOUT_S, expired)
    log.info("member_change_proposed", op=change.op, node=change.node)
    session.server.replica.change_membership(change, answer)
