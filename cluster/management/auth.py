"""Who is asking, and may they: HTTP Basic or a signed session cookie, rights, CSRF.

- `admin` is the cluster's own credential: user `admin` (or `quorumq`, the AMQP listener's name
  for it), password the client key (the contents of `D/client.key`, which every client of the
  cluster already holds). Admin rights.
- `[[users]]` of cluster.toml: a name, a scrypt `password_hash`, rights `read` or `admin`.
- The browser logs in once (`POST /api/login`) and gets a session cookie (HttpOnly,
  SameSite=Strict) signed with a key derived from the cluster secret (valid on every node).
- A write (POST/PUT/DELETE) is refused (403) when its Origin (or Referer) names another site;
  with a cookie it must also carry `X-CSRF-Token` (a value derived from the session, given by
  `/api/login` and `/api/whoami`); with Basic credentials a POST must be `application/json` (an HTML
  form cannot send that, nor a PUT or DELETE, cross-site without a CORS preflight, which this
  server never grants).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from cluster.config import UserConfig, UserRights
from cluster.management.passwords import BadPasswordHash, verify_password

ADMIN_USER = "admin"
CLUSTER_USER = "quorumq"  # the AMQP listener's name for the same credential (cluster/amqp/auth.py)
KEY_USERS = frozenset({ADMIN_USER, CLUSTER_USER})  # password: the client key; admin rights
SESSION_LABEL = b"quorumq management session v1"
SESSION_TTL_S = 12 * 3600
SESSION_COOKIE_BYTES_MAX = 1024
CSRF_HEADER = "X-CSRF-Token"
UI_HEADER = "X-Requested-With"  # the UI sends it: no browser login prompt on its 401s
VERIFIED_CACHE_MAX = 256  # scrypt costs ~50 ms: a Basic user is verified once, then remembered
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
HASHES_IN_FLIGHT_MAX = 2  # scrypt takes 16 MiB and a core for ~50 ms each


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: name, rights, and the session token when from a cookie."""

    name: str
    rights: UserRights
    session: str | None = None


class Refused(Exception):
    """Raised for a request that may not proceed: `status` 401 or 403, and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Authenticator:
    """Checks credentials and sessions against the admin key and the configured users."""

    def __init__(self, client_key: bytes, users: tuple[UserConfig, ...], cookie: str) -> None:
        self._admin_password = client_key.decode("ascii")
        self._users = {user.name: user for user in users}
        self._session_key = hmac.new(client_key, SESSION_LABEL, hashlib.sha256).digest()
        self._cache_key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, bool] = OrderedDict()  # touched on the loop only
        self._hashing = asyncio.Semaphore(HASHES_IN_FLIGHT_MAX)
        self.cookie = cookie

    def rights_of(self, name: str) -> UserRights | None:
        """The current rights of user `name`, None if there is no such user any more."""
        if name in KEY_USERS:
            return "admin"
        user = self._users.get(name)
        return user.rights if user is not None else None

    async def check_password(self, name: str, password: str) -> Principal:
        """The principal for a name and password; Refused(401) when they do not match. A
        configured user's scrypt runs in a worker thread (it would hold the node's loop ~50 ms),
        at most HASHES_IN_FLIGHT_MAX at once; its result is remembered on the loop."""
        if name in KEY_USERS:
            if hmac.compare_digest(password.encode("utf-8"), self._admin_password.encode()):
                return Principal(name, "admin")
            raise Refused(401, "wrong user name or password")
        user = self._users.get(name)
        if user is None or not await self._verify(user, password):
            raise Refused(401, "wrong user name or password")
        return Principal(user.name, user.rights)

    async def _verify(self, user: UserConfig, password: str) -> bool:
        token = hmac.new(
            self._cache_key, f"{user.name}\0{password}\0{user.password_hash}".encode(), "sha256"
        ).digest()
        known = self._verified.get(token)
        if known is not None:
            return known
        async with self._hashing:
            ok = await asyncio.to_thread(_matches, password, user.password_hash)
        self._verified[token] = ok
        if len(self._verified) > VERIFIED_CACHE_MAX:
            self._verified.popitem(last=False)
        return ok

    # --- sessions (cookies) -------------------------------------------------------------

    def new_session(self, principal: Principal) -> str:
        """A signed session token for `principal`, valid SESSION_TTL_S."""
        body = json.dumps(
            {"u": principal.name, "exp": int(time.time()) + SESSION_TTL_S,
             "n": secrets.token_hex(8)},
            separators=(",", ":"),
        ).encode()  # fmt: skip
        payload = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{payload}.{self._sign(payload)}"

    def csrf_token(self, session: str) -> str:
        """The CSRF token that goes with a session (derived: nothing to store)."""
        return self._sign("csrf:" + session)

    def _sign(self, text: str) -> str:
        return hmac.new(self._session_key, text.encode(), hashlib.sha256).hexdigest()

    def from_session(self, token: str) -> Principal | None:
        """The principal of a valid, unexpired session token whose user still exists."""
        if len(token) > SESSION_COOKIE_BYTES_MAX or "." not in token:
            return None
        payload, signature = token.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            name, expires = str(body["u"]), int(body["exp"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        rights = self.rights_of(name)
        if expires < time.time() or rights is None:
            return None
        return Principal(name, rights, token)

    # --- per request ----------------------------------------------------------------------

    async def authenticate(self, request: web.Request) -> Principal:
        """The caller of `request` (Basic first, then the session cookie); Refused(401)."""
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError) as err:
                raise Refused(401, "malformed Basic credentials") from err
            name, _, password = decoded.partition(":")
            return await self.check_password(name, password)
        token = request.cookies.get(self.cookie)
        if token:
            principal = self.from_session(token)
            if principal is not None:
                return principal
            raise Refused(401, "the session expired or is not valid here: log in again")
        raise Refused(401, "credentials required (Basic, or log in through /api/login)")

    def check_write(self, request: web.Request, principal: Principal) -> None:
        """Refused(403) for a write that is cross-site, lacks its CSRF proof, or is read-only."""
        check_same_origin(request)
        if principal.session is not None:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent, self.csrf_token(principal.session)):
                raise Refused(403, f"missing or wrong {CSRF_HEADER} header")
        elif request.method == "POST" and request.content_type != "application/json":
            raise Refused(403, "a POST with Basic credentials must be application/json")
        if principal.rights != "admin":
            raise Refused(403, f"user {principal.name!r} has read-only rights")


def _matches(password: str, encoded: str) -> bool:
    """Whether `password` matches `encoded` (a malformed hash matches nothing)."""
    try:
        return verify_password(password, encoded)
    except BadPasswordHash:
        return False


def check_same_origin(request: web.Request) -> None:
    """Refused(403) when the request's Origin (or Referer) is not this server's host."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if origin is None:
        return
    if origin == "null" or urlsplit(origin).netloc != request.host:
        raise Refused(403, f"cross-site request refused (origin {origin!r})")
