"""SASL PLAIN and AMQPLAIN against the credentials the cluster knows.

Until users are stored through the log (machine v4), a node accepts one user, `quorumq`, whose
password is the cluster's client key (the hex text of `D/client.key`), and, only when
`amqp_guest = true` in cluster.toml and only from a loopback address, RabbitMQ's `guest`/`guest`.
"""

from __future__ import annotations

import hmac
import ipaddress
import struct
from typing import Any

from pamqp import decode

from cluster.amqp.errors import ACCESS_REFUSED, ConnectionRefusal

USER = "quorumq"
GUEST = "guest"
MECHANISMS = ("PLAIN", "AMQPLAIN")
RESPONSE_BYTES_MAX = 4096


def credentials(mechanism: str, response: bytes) -> tuple[str, str]:
    """(user, password) from a SASL response; 403 when it does not parse."""
    if len(response) > RESPONSE_BYTES_MAX:
        raise _refused(mechanism)
    try:
        if mechanism == "PLAIN":
            _authzid, login, secret = response.split(b"\x00", 2)
            return login.decode("utf-8"), secret.decode("utf-8")
        if mechanism == "AMQPLAIN":
            _used, table = decode.field_table(struct.pack(">I", len(response)) + response)
            return _text(table.get("LOGIN")), _text(table.get("PASSWORD"))
    except (ValueError, UnicodeDecodeError, struct.error) as err:
        raise _refused(mechanism) from err
    raise ConnectionRefusal(
        ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}' (use PLAIN)"
    )


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise ValueError("LOGIN and PASSWORD must be strings")
    return value


def check(
    mechanism: str, response: bytes, client_key: bytes, guest_allowed: bool, peer: str
) -> str:
    """The authenticated user name; ConnectionRefusal (403, RabbitMQ's text) otherwise."""
    user, password = credentials(mechanism, response)
    if user == USER and hmac.compare_digest(password.encode("utf-8"), client_key):
        return user
    if user == GUEST and password == GUEST and guest_allowed:
        if not _loopback(peer):
            raise ConnectionRefusal(
                ACCESS_REFUSED,
                "User 'guest' can only connect via localhost (amqp_guest = true in cluster.toml)",
            )
        return user
    raise _refused(mechanism)


def _loopback(peer: str) -> bool:
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


def _refused(mechanism: str) -> ConnectionRefusal:
    return ConnectionRefusal(
        ACCESS_REFUSED,
        f"Login was refused using authentication mechanism {mechanism}. For details see the "
        "broker logfile.",
    )
