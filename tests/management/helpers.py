"""HTTP helpers of the management tests (urllib: nothing shared with the server's aiohttp)."""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cluster.launcher import LocalCluster

VIEWER = ("viewer", "viewer-password")


def base_url(cluster: LocalCluster, node_id: str) -> str:
    """The management URL of a node."""
    port = cluster.config.node(node_id).http_port
    assert port is not None
    return f"http://127.0.0.1:{port}"


def admin_auth(cluster: LocalCluster) -> tuple[str, str]:
    """The admin credentials: user admin, the client key as password."""
    return ("admin", cluster.key.decode("ascii"))


def http(
    url: str,
    method: str = "GET",
    auth: tuple[str, str] | None = None,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One request: (status, parsed JSON or text, headers); never raises on an HTTP error."""
    sent = dict(headers or {})
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    if auth is not None:
        sent["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            status, payload, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as err:
        status, payload, got = err.code, err.read(), dict(err.headers)
    text = payload.decode("utf-8", "replace")
    try:
        return status, json.loads(text), got
    except ValueError:
        return status, text, got


def screenshot_dir(tmp_path: Path) -> Path:
    """Where the browser test saves its screenshots: $QUORUMQ_SCREENSHOTS or a tmp dir."""
    chosen = os.environ.get("QUORUMQ_SCREENSHOTS")
    path = Path(chosen) if chosen else tmp_path / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path
