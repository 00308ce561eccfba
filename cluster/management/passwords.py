"""Password hashes for the `[[users]]` of cluster.toml: scrypt, salted, in one string.

Format: `scrypt$<n>$<r>$<p>$<salt hex>$<hash hex>`; `python -m cluster.management
hash-password` writes one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
PASSWORD_BYTES_MAX = 1024
SCRYPT_MEMORY_BYTES_MAX = 64 * 1024 * 1024  # a hash asking for more is refused, not computed


class BadPasswordHash(ValueError):
    """Raised when a `password_hash` of cluster.toml is not in the format above."""


def hash_password(password: str) -> str:
    """A new salted scrypt hash of `password`."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, encoded: str) -> bool:
    """Whether `password` matches `encoded` (BadPasswordHash when `encoded` is malformed)."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise BadPasswordHash("a password_hash is 'scrypt$n$r$p$salt$hash'")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError as err:
        raise BadPasswordHash(f"a password_hash field does not parse: {err}") from err
    if n < 2 or r < 1 or p < 1 or 128 * n * r * p > SCRYPT_MEMORY_BYTES_MAX or not expected:
        raise BadPasswordHash("password_hash scrypt parameters out of range")
    if len(password.encode("utf-8")) > PASSWORD_BYTES_MAX:
        return False
    return hmac.compare_digest(_scrypt(password, salt, n, r, p, len(expected)), expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, size: int = HASH_BYTES) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=SCRYPT_MEMORY_BYTES_MAX + 1024 * 1024,
        dklen=size,
    )
