"""BSD sysexits exit codes, the one mapping every CLI command uses."""

from __future__ import annotations

OK = 0
FAILURE = 1  # a check ran and found a problem (e.g. a fuzz invariant violation)
USAGE = 64  # EX_USAGE: bad flags or arguments
DATA = 65  # EX_DATAERR: bad input data (a malformed log file, a refused command)
NO_INPUT = 66  # EX_NOINPUT: a file or data dir that does not exist
UNAVAILABLE = 69  # EX_UNAVAILABLE: no node reachable, no leader
SOFTWARE = 70  # EX_SOFTWARE: an internal error
CANT_CREATE = 73  # EX_CANTCREAT: cannot write an output file
TEMPORARY = 75  # EX_TEMPFAIL: try again (timeout, leader changing)
NO_PERMISSION = 77  # EX_NOPERM: wrong credentials
CONFIG = 78  # EX_CONFIG: bad or missing configuration


class CliError(Exception):
    """Raised by a command to stop with a message and an exit code; printed by `main`."""

    def __init__(self, message: str, exit_code: int = FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code
