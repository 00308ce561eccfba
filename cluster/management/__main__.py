"""`python -m cluster.management hash-password`: print a `password_hash` for cluster.toml."""

from __future__ import annotations

import getpass
import sys

from cluster.management.passwords import hash_password


def main(argv: list[str]) -> int:
    """Read a password (twice, from the terminal, or one line of stdin) and print its hash."""
    if argv != ["hash-password"]:
        print("usage: python -m cluster.management hash-password", file=sys.stderr)
        return 64
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("error: the passwords differ", file=sys.stderr)
            return 65
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        print("error: an empty password", file=sys.stderr)
        return 65
    print(hash_password(password))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
