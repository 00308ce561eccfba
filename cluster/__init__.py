"""The I/O shell of quorumq: node server, wire protocol, client library, admin CLI."""
