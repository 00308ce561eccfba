"""An allow-list unpickler installed into pysyncobj (defense in depth behind the password),
and a pickler that stores bytes as bytes.

pysyncobj unpickles wire messages, log commands and snapshots through the module attributes
`pysyncobj.pickle.loads/load`; replacing them covers every path. Only the few globals that
pysyncobj's own messages need are allowed; any other global (an `os.system` gadget) is refused.

pysyncobj pickles with protocol 2 (for Python 2 peers), which writes bytes as
`_codecs.encode(text, "latin1")`: a message body cost up to twice its size in the journal and on
the wire, and about 20 ms per MiB to encode and decode on the node's loop. `install` makes
`pysyncobj.pickle.dumps/dump` use `PROTOCOL` (bytes as they are, no globals); the protocol-2
pickles of journals and peers from before still load (the allow-list keeps `_codecs.encode`).
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import pysyncobj.journal as pysyncobj_journal
import pysyncobj.pickle as pysyncobj_pickle

# what pysyncobj's messages and log commands are pickled with once installed (Python 3.8+)
PROTOCOL = 5
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("_codecs", "encode"),  # protocol 2 encodes bytes as _codecs.encode(str, "latin1")
        # ... and b"" as bytes(): the last chunk of every snapshot sent to a lagging follower
        ("builtins", "bytes"),
        ("__builtin__", "bytes"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytearray"),
        ("__builtin__", "set"),  # protocol 2 writes Python 2 module names
        ("__builtin__", "frozenset"),
        ("__builtin__", "bytearray"),
        ("collections", "deque"),
        ("collections", "OrderedDict"),
        ("pysyncobj.node", "TCPNode"),  # membership commands carry nodes
        ("pysyncobj.node", "Node"),
    }
)


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler whose `find_class` only resolves allow-listed globals."""

    def find_class(self, module: str, name: str) -> Any:
        """Resolve `module.name` if allow-listed, else raise UnpicklingError."""
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def loads(data: bytes | str) -> Any:
    """Restricted replacement for `pysyncobj.pickle.loads`."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    return RestrictedUnpickler(io.BytesIO(raw)).load()


def load(file: IO[bytes]) -> Any:
    """Restricted replacement for `pysyncobj.pickle.load`."""
    return RestrictedUnpickler(file).load()


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """Replacement for `pysyncobj.pickle.dumps`: protocol `PROTOCOL`, whatever is asked."""
    return pickle.dumps(obj, PROTOCOL)


def dump(obj: Any, file: IO[bytes], protocol: int | None = None) -> None:
    """Replacement for `pysyncobj.pickle.dump`: protocol `PROTOCOL`, whatever is asked."""
    pickle.dump(obj, file, PROTOCOL)


def install() -> None:
    """Replace pysyncobj's pickle loaders with the restricted ones, and its picklers with
    protocol-`PROTOCOL` ones (idempotent)."""
    pysyncobj_pickle.loads = loads
    pysyncobj_pickle.load = load
    pysyncobj_pickle.dumps = dumps
    pysyncobj_pickle.dump = dump
    pysyncobj_journal.loads = loads  # the journal's meta file imports `loads` by name
    pysyncobj_journal.dumps = dumps


def installed() -> bool:
    """Whether the restricted loaders (and the protocol-`PROTOCOL` picklers) are in place."""
    return pysyncobj_pickle.loads is loads and pysyncobj_pickle.load is load
