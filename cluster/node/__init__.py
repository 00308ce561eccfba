"""The node process: server, effect routing, leader timers, logging (entry: `run_node`)."""
