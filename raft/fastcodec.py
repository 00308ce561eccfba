"""fifo's codec on the hot path (Enqueue, Settle / Return / Discard, Deliver): `fifo.wire`.

The fast paths used to be hand-written CBOR here; they are now derived from the codec's schemas
in `fifo/wire.py` (tested byte-for-byte against the generic encoder), and re-exported here for
raft and the node.
"""

from __future__ import annotations

from fifo.wire import decode_command, encode_command, encode_effect

__all__ = ["decode_command", "encode_command", "encode_effect"]
