"""Machine version 4: a flat, complete copy of v3's behaviour (imports nothing from v1-v3), with
consumer timeouts by deadline and no catch-all in `apply`. Not released: not in
tests/fifo/corpus/SHIPPED.txt, and no node runs it unless allowed (see fifo/README.md)."""
