"""The `quorumq` admin CLI: one module per command group, a thin layer over the client library."""
