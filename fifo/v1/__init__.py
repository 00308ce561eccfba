"""Machine version 1, frozen."""
