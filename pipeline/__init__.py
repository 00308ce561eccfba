"""PySpark jobs over the fifo machine: distributed fuzz campaigns (see DESIGN.md section 6) and
log analytics (`analyze`: replays a `log export` through the machine).

`pipeline -> fifo` and `pipeline -> raft` (the export format, read only) are the only dependency
directions; nothing here is imported by `fifo` or `raft`.
"""
