"""Limits on everything the machine accepts; names carry their unit last."""

from __future__ import annotations

queue_name_bytes_max = 255
enqueuer_name_bytes_max = 255
consumer_tag_bytes_max = 255
node_name_bytes_max = 255
body_bytes_max = 16 * 1024 * 1024
msg_ids_per_command_max = 4096
consumer_keys_per_command_max = 4096
prefetch_max = 65_535
queues_max = 10_000
consumers_per_queue_max = 10_000
enqueuers_per_queue_max = 10_000
annotations_per_message_max = 32
annotation_bytes_max = 255
priority_abs_max = 255
ttl_ms_max = 10 * 365 * 24 * 3600 * 1000
timeout_ms_max = 10 * 365 * 24 * 3600 * 1000
length_max = 1 << 48
seq_max = (1 << 63) - 1
int_field_max = (1 << 63) - 1
serial_modulus = 1 << 32
dead_letter_hops_max = 4
groups_per_queue_max = 100_000  # v3: message groups tracked per queue (waiting, held or owned)
partitions_max = 256  # v3: partitions of one partitioned queue
consumer_groups_max = 1_000  # v3: consumer groups
group_members_max = 1_000  # v3: members of one consumer group
group_name_bytes_max = 255  # v3: consumer group and member names
# v4: a message's body reference is the meta index of its enqueuing command, which raft gives as
# raft index * commands_per_entry_max + position (raft.entry.SUB_INDEX_SPAN, tested equal)
commands_per_entry_max = 1024
# v4: exchanges and bindings (issue 27)
exchanges_max = 10_000  # declared exchanges (the default exchange is implicit, not counted)
exchange_name_bytes_max = 255  # AMQP shortstr
routing_key_bytes_max = 255  # AMQP shortstr: a publish's routing key and a binding key
bindings_per_exchange_max = 10_000  # (queue, binding key, arguments) triples of one exchange
binding_arguments_max = 32  # pairs in one binding's arguments (headers: the matched headers)
headers_per_publish_max = 64  # message headers a publish carries for headers-exchange routing
queues_per_publish_max = 1_024  # queues one publish may be stored in (more: refused)
# exchanges one publish is routed through, its own included, over exchange-to-exchange bindings
# (each at most once: cycles end there; more: refused). Bounds a publish's routing work too.
exchanges_per_publish_max = 16
