"""AMQP 0-9-1 refusals: a reply code and RabbitMQ's reply text, closing a channel or the connection.

Raised inside a method handler; the connection turns it into `channel.close` or
`connection.close` naming the method that failed, as RabbitMQ does.
"""

from __future__ import annotations

# reply codes of the AMQP 0-9-1 specification (RabbitMQ's texts use these names as prefixes)
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541
NO_ROUTE = 312

REPLY_NAMES = {
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


def reply_text(code: int, text: str) -> str:
    """RabbitMQ's form of a reply text: the code's name, a dash, the explanation."""
    return f"{REPLY_NAMES.get(code, str(code))} - {text}"


class AmqpError(Exception):
    """Base of the refusals below: `code` is the AMQP reply code, `text` the explanation."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(reply_text(code, text))
        self.code = code
        self.text = text
        self.method_ids = (0, 0)  # class and method id of the method that failed, when known

    @property
    def reply_text(self) -> str:
        """The full reply text sent in the close method (at most 255 bytes)."""
        return reply_text(self.code, self.text).encode("utf-8")[:255].decode("utf-8", "ignore")


class ChannelRefusal(AmqpError):
    """Raised when a method fails in a way that closes its channel only (404, 405, 406, 403)."""


class ConnectionRefusal(AmqpError):
    """Raised when a method fails in a way that closes the whole connection (5xx, 320, 530)."""


def not_implemented(feature: str) -> ConnectionRefusal:
    """The 540 refusal of a feature quorumq does not have (yet), naming it."""
    return ConnectionRefusal(NOT_IMPLEMENTED, f"{feature}: not implemented by quorumq")
