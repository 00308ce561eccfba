"""Machine version 2, frozen."""
