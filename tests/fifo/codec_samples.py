"""One instance of every class the codec tags, for the byte-level golden fixture (codec_tags.hex).

Fields are set away from their defaults where possible, so a field dropped or reordered shows.
"""

from __future__ import annotations

from fifo import commands as c
from fifo import effects as e
from fifo import replies as r
from fifo.meta import Meta

CONN = c.ConnectionId("n1", 2**40, 3)
CID = c.ConsumerId("tag-1", CONN)
CONFIG = c.QueueConfig(True, 3, 100, 4096, "reject_publish", 60_000, "dlq", 30_000, 5_000)
DELIVERY = e.Delivery(7, b"body", True, 2, (("k", "v"), ("n", -1)))

SAMPLES: tuple[object, ...] = (
    CONN,
    CID,
    CONFIG,
    c.SimplePrefetch(10),
    c.Credited(5),
    c.Cancel(),
    c.Remove(),
    c.Dequeue(True),
    c.DeclareQueue("q", CONFIG),
    c.DeleteQueue("q"),
    c.UpdateConfig("q", c.QueueConfig()),
    c.Enqueue("q", b"x" * 20, "e", 9, CONN, 1_000),
    c.RegisterEnqueuer("q", "e", CONN),
    c.Checkout("q", CID, c.SimplePrefetch(3), -2, 10_000),
    c.Settle("q", 1024, (0, 1, 2)),
    c.Return("q", CID, (3,)),
    c.Discard("q", 5, (4, 5)),
    c.Modify("q", 5, (6,), True, False, (("x-reason", "bad"), ("n", 2))),
    c.Credit("q", 5, 10, 2**32 - 1, True),
    c.RenewLocks("q", 5, (1,)),
    c.Purge("q"),
    c.EvalConsumerTimeouts("q", (5, CID)),
    c.ConsumerDisconnectedTimeout("q", CID),
    c.Expire("q"),
    c.ConnectionDown(CONN, "noconnection"),
    c.NodeDown("n2"),
    c.NodeUp("n2"),
    Meta(1025, 3, 1_700_000_000_000, 2),
    r.Ok(),
    r.Error("unknown_queue", "no queue 'q'"),
    r.NotEnqueued(4),
    r.RejectPublish(),
    r.DeclareOk(True),
    r.DeleteOk(12),
    r.CheckoutOk(5, 3, 7, 11, True, 2),
    r.CancelOk(None, 0),
    r.DequeuedMessage(0, b"m", 1, True),
    r.DequeueOk(r.DequeuedMessage(0, b"m", 1, True), 4, 5),
    r.PurgeOk(6),
    DELIVERY,
    e.Deliver(CONN, "q", "tag-1", 5, (DELIVERY, e.Delivery(8, b"", False, 0))),
    e.CreditReply(CONN, "q", "tag-1", 5, 9, 1, 0, False, True),
    e.QueueStatus(CONN, "q", "e", "reject_publish"),
    e.Released(CONN, "q", "tag-1", CID, (1, 2), "timeout"),
    e.ConsumerUpdate(CONN, "q", "tag-1", 5, False, "waiting"),
    e.ConsumerCancelled(CONN, "q", "tag-1", 5, "queue_deleted"),
    e.DeadLettered("q", "delivery_limit", 2, "dlq"),
    # machine v3: message groups
    c.GroupConfig("customer", "exclusive", True),
    c.DeclareGroupedQueue("q", c.QueueConfig(max_length=100), c.GroupConfig()),
    c.AnnotatedEnqueue("q", b"m", "e", 9, CONN, 1000, (("x-group-id", "g1"), ("n", 3))),
    c.PurgeGroup("q", "g1"),
    # machine v3: partitioned queues and consumer groups
    c.DeclarePartitionedQueue("orders", c.QueueConfig(single_active_consumer=True), 8),
    c.JoinGroup("orders", CID, c.SimplePrefetch(10), 0, None, "billing", "m1"),
    c.LeaveGroup("orders", CID, c.Cancel(), 0, None, "billing", "m1", 3),
    r.JoinGroupOk(3, 8),
    e.GroupAssigned(CONN, "orders.1", "tag-1", 5, True, "single_active", "billing", "m1", 3),
    e.GroupRevoked(CONN, "orders.1", "tag-1", 5, False, "waiting", "billing", "m1", 4),
    # machine v4: bodies kept in the log, by reference (issue 32)
    e.RefDelivery(8, 5 * 1024 + 3, 2048, True, 1, (("k", "v"),)),
    e.RefDeliver(CONN, "q", "tag-1", 5, (DELIVERY, e.RefDelivery(8, 5 * 1024 + 3, 2048, False, 0))),
    r.RefDequeuedMessage(0, 6 * 1024, 10, 1, True),
    r.RefDequeueOk(r.RefDequeuedMessage(0, 6 * 1024, 10, 0, False), 4, 77),
    c.BoundSettle("q", 1024, (0, 1, 2), CONN),
    c.BoundReturn("q", CID, (3,), CONN),
    c.BoundDiscard("q", 7, (4, 5)),
    c.BoundModify("q", 5, (6,), True, False, (("x-reason", "bad"), ("n", 2)), CONN),
    c.BoundRenewLocks("q", 2048, (7, 8), CONN),
    # machine v4: exchanges and bindings (issue 27)
    c.DeclareExchange("celeryev", "topic", True),
    c.DeleteExchange("celeryev", True),
    c.BindQueue("q", "celeryev", "worker.#", (("x-match", "any"), ("n", 2))),
    c.UnbindQueue("q", "celeryev", "worker.*", (("k", "v"),)),
    c.PublishToExchange("celeryev", "worker.heartbeat", b"m", (("h", 1),), True, 1_000),
    r.Routed(("q1", "q2"), ("q3",)),
    r.Unroutable("celeryev", "worker.heartbeat"),
    c.BindExchange("celeryev", "amq.topic", "worker.#", (("x-match", "all"), ("n", 3))),
    c.UnbindExchange("celeryev", "amq.topic", "worker.*", (("k", "v"),)),
)
