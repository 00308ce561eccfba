"""Machine version 3: v2 plus message groups and consumer groups over partitioned queues
(released: frozen, its corpus is pinned in tests/fifo/corpus/SHIPPED.txt)."""
