"""AMQP 0-9-1 on every node: RabbitMQ's clients (pika, aio-pika, py-amqp/kombu) speak to quorumq.

Frames are read and written with `pamqp` (RabbitMQ's own codec); each connection translates
AMQP methods into the node's replicated commands (`fifo.commands`) and their effects back into
AMQP methods. Only the default exchange exists until machine v4 (docs/amqp.md).
"""
