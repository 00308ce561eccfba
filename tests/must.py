"""A typed helper for tests: a value the test expects to be there (not None)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def must(value: T | None, what: str = "the value") -> T:
    """`value`, which the test expects to exist; AssertionError when it is None (where the
    untyped code would have failed on the next attribute access)."""
    assert value is not None, f"{what} is missing (None)"
    return value
