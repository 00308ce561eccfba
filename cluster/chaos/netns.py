"""Hosts of their own on one machine: a network namespace per host, joined by a bridge.

`NetnsLab` (root and iproute2 needed; `unavailable()` says why not) makes one namespace per
host with its own address on a veth pair whose other end sits on a bridge in a private
"switch" namespace, so nothing is added to the machine's own namespace. A partition is a real
link failure: the host's veth end on the switch taken down (`link_down`), healed by taking it
up. Processes start in a host's namespace (`popen`), and the calling thread can enter one
(`entered`: threads it starts there, such as a client's, stay in it).

Every name starts with a prefix unique to the lab (pid and random), so parallel runs never
collide; `close()` (also on failure, through `netns_lab`) kills what runs in the namespaces
and deletes them, which removes their links and the bridge.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

log = structlog.get_logger(__name__)

SUBNET = "10.77.0"  # private to the lab's namespaces: no route from the machine's own
SUBNET_BITS = 24
HOSTS_MAX = 200
IP_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0
LINK_UP_WAIT_S = 5.0  # a link set up is usable once the kernel says so (carrier), not at once
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
BRIDGE = "br0"
HOST_INTERFACE = "eth0"


class NetnsError(RuntimeError):
    """Raised when an `ip` command of the lab fails (the command and its stderr are named)."""


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no `ip`), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the test as root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return None


def _ip(*args: str) -> str:
    """Run `ip ARGS`; its stdout, or NetnsError with the command and its stderr."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Host:
    """One host: its namespace, its address and its link's end on the switch."""

    label: str
    namespace: str
    address: str
    switch_port: str


@dataclass
class NetnsLab:
    """Namespaces for hosts on one bridge; see the module docstring."""

    prefix: str = field(default_factory=lambda: f"qq{os.getpid()}{secrets.token_hex(2)}")
    subnet: str = SUBNET  # the first three octets of the hosts' /24
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _switch: str | None = None

    def switch(self) -> str:
        """The switch namespace (made on first use) holding the bridge."""
        if self._switch is None:
            name = f"{self.prefix}-sw"
            _ip("netns", "add", name)
            self._switch = name
            _ip("-n", name, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", name, "link", "set", BRIDGE, "up")
        return self._switch

    def add_host(self, label: str, last_octet: int | None = None) -> Host:
        """A new namespace `PREFIX-label` with address `subnet.N` (N: `last_octet`, or the
        number of hosts so far + 1) on a veth to the bridge."""
        if label in self.hosts or len(self.hosts) >= HOSTS_MAX:
            raise NetnsError(f"host {label!r} exists, or the lab has {HOSTS_MAX} hosts already")
        address = f"{self.subnet}.{last_octet or len(self.hosts) + 1}"
        if any(known.address == address for known in self.hosts.values()):
            raise NetnsError(f"address {address} is taken in the lab")
        switch = self.switch()
        namespace = f"{self.prefix}-{label}"
        host = Host(label, namespace, address, f"v{len(self.hosts)}")
        _ip("netns", "add", namespace)
        self.hosts[label] = host
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip(
            "link", "add", HOST_INTERFACE, "netns", namespace, "type", "veth",
            "peer", "name", host.switch_port, "netns", switch,
        )  # fmt: skip
        _ip("-n", switch, "link", "set", host.switch_port, "master", BRIDGE, "up")
        _ip("-n", namespace, "addr", "add", f"{host.address}/{SUBNET_BITS}", "dev", HOST_INTERFACE)
        _ip("-n", namespace, "link", "set", HOST_INTERFACE, "up")
        log.info("netns_host_added", host=label, namespace=namespace, address=host.address)
        return host

    def link_down(self, label: str) -> None:
        """Cut `label` off the network: its link on the switch goes down (a real link failure)."""
        _ip("-n", self.switch(), "link", "set", self.hosts[label].switch_port, "down")
        log.info("netns_link_down", host=label)

    def link_up(self, label: str) -> None:
        """Heal `label`'s link; returns once the kernel reports both ends up (bounded)."""
        host = self.hosts[label]
        _ip("-n", self.switch(), "link", "set", host.switch_port, "up")
        deadline = time.monotonic() + LINK_UP_WAIT_S
        while time.monotonic() < deadline:
            ends = [(self.switch(), host.switch_port), (host.namespace, HOST_INTERFACE)]
            if all(
                " state UP " in _ip("-n", ns, "-o", "link", "show", "dev", dev) for ns, dev in ends
            ):
                break
            time.sleep(0.02)
        log.info("netns_link_up", host=label)

    def popen(self, label: str, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `args` in `label`'s namespace, in a session of its own (killed by close)."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[label].namespace, *args],
            start_new_session=True,
            **kwargs,
        )
        self.processes.append(process)
        return process

    def run(
        self, label: str, args: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run `args` in `label`'s namespace to completion (text output captured)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[label].namespace, *args],
            capture_output=True, text=True, check=False, **kwargs,
        )  # fmt: skip

    @contextlib.contextmanager
    def entered(self, label: str) -> Iterator[None]:
        """Move the calling thread into `label`'s namespace for the block (threads started in
        it stay there: close clients inside the block)."""
        with _setns(NETNS_DIR / self.hosts[label].namespace):
            yield

    def close(self) -> None:
        """Stop every process in the lab's namespaces (SIGTERM, then SIGKILL) and delete them:
        their links and the bridge go with them. Safe to call twice."""
        namespaces = [host.namespace for host in self.hosts.values()]
        namespaces += [self._switch] if self._switch else []
        _stop(self.processes, _pids_in(namespaces))
        for namespace in namespaces:
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", namespace)
        self.hosts.clear()
        self._switch = None
        self.processes.clear()


def _pids_in(namespaces: list[str]) -> set[int]:
    pids: set[int] = set()
    for namespace in namespaces:
        with contextlib.suppress(NetnsError):
            pids |= {int(pid) for pid in _ip("netns", "pids", namespace).split()}
    return pids


def _stop(processes: list[subprocess.Popen[bytes]], pids: set[int]) -> None:
    """SIGTERM the lab's processes and whatever else runs in its namespaces; SIGKILL after
    STOP_GRACE_S; reap the ones this process started."""
    for pid in pids | {p.pid for p in processes if p.poll() is None}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_GRACE_S)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _setns(path: Path) -> Iterator[None]:
    """Enter the network namespace at `path` on this thread, and leave it after the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise NetnsError(f"setns {path}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:  # a thread left in the lab is a bug
                raise NetnsError(f"cannot return from {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(target)
        os.close(home)


@contextlib.contextmanager
def netns_lab(labels: Sequence[str], subnet: str = SUBNET) -> Iterator[NetnsLab]:
    """A lab with a host per label, closed (processes, namespaces, links) however the block
    ends, half-made labs included."""
    lab = NetnsLab(subnet=subnet)
    try:
        for label in labels:
            lab.add_host(label)
        yield lab
    finally:
        lab.close()


def log_file(path: Path) -> IO[bytes]:
    """An output file for a lab process (0600: node logs may name the cluster's hosts)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab")
