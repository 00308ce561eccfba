"""Machine version 3: v2 plus message groups (not released yet: its corpus may be regenerated)."""
