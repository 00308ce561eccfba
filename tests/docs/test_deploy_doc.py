"""docs/deploy.md followed step by step: its marked blocks run as written, in one network
namespace per machine at the page's addresses; the systemd unit is what starts each node."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.chaos.netns import NetnsLab, netns_lab, unavailable

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deploy.md"
UNIT = ROOT / "docs" / "deploy" / "quorumq.service"
BIN = Path(sys.executable).parent
BLOCK = re.compile(r"<!-- deploy: (\w+) -->\n```bash\n(.*?)```", re.DOTALL)
SCP = re.compile(r"^scp -rp (\S+) root@10\.0\.0\.(\d+):(/var/lib/quorumq)$")
ADMIN_OCTET = 10
BLOCK_TIMEOUT_S = 90


def marked_blocks() -> list[tuple[str, str]]:
    """(kind, script) of every `<!-- deploy: KIND -->` bash block, in page order."""
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def unit_command(machine: Path) -> list[str]:
    """The unit's ExecStart, with the install paths mapped onto this machine's dirs."""
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("ExecStart="))
    command = line.removeprefix("ExecStart=").replace("/opt/quorumq/venv/bin", str(BIN))
    return command.replace("/var/lib/quorumq", str(machine / "var/lib/quorumq")).split()


def test_the_page_has_the_steps_the_test_runs() -> None:
    """The marked blocks: init, copy, use, add-host, copy, member changes (a block lost to an
    edit fails here, not silently)."""
    kinds = [kind for kind, _ in marked_blocks()]
    assert kinds == ["admin", "copy", "admin", "admin", "copy", "admin"]


def test_the_systemd_unit_verifies() -> None:
    """`systemd-analyze verify` accepts the unit (with its binary path mapped to this venv)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    unit = Path(os.environ.get("TMPDIR", "/tmp")) / f"quorumq-{os.getpid()}.service"
    unit.write_text(UNIT.read_text().replace("/opt/quorumq/venv/bin", str(BIN)))
    try:
        done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    finally:
        unit.unlink()
    assert done.returncode == 0, done.stderr


def _copy_and_start(lab: NetnsLab, script: str, admin: Path, machines: Path) -> None:
    """Each `scp -rp SRC root@10.0.0.N:/var/lib/quorumq` as a copy into machine N's dir,
    then the unit's command started in that machine's namespace."""
    for line in script.strip().splitlines():
        found = SCP.match(line.strip())
        assert found is not None, f"not a copy the test can emulate: {line!r}"
        source, octet, target = found.groups()
        machine = machines / octet
        shutil.copytree(admin / source, machine / target.lstrip("/"), symlinks=True)
        with (machine / "node.out").open("wb") as log:
            lab.popen(f"m{octet}", unit_command(machine), stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.cluster
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_the_deploy_page_runs_as_written(tmp_path: Path) -> None:
    """Every marked block of docs/deploy.md, in order: the admin blocks in the admin machine's
    namespace (10.0.0.10) with a bash that stops at the first failing command, the copies into
    the machines 10.0.0.1-4, each started by the unit's ExecStart in its own namespace; the
    published messages all come back and n3 ends replaced by n4."""
    admin, machines = tmp_path / "admin", tmp_path / "machines"
    admin.mkdir()
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    outputs = []
    with netns_lab([], subnet="10.0.0") as lab:
        lab.add_host("admin", ADMIN_OCTET)
        for octet in (1, 2, 3, 4):
            lab.add_host(f"m{octet}", octet)
        for kind, script in marked_blocks():
            if kind == "copy":
                _copy_and_start(lab, script, admin, machines)
                continue
            done = lab.run(
                "admin", ["bash", "-euo", "pipefail", "-c", script],
                cwd=admin, env=env, timeout=BLOCK_TIMEOUT_S,
            )  # fmt: skip
            assert done.returncode == 0, (
                f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            )
            outputs.append(done.stdout)
    assert outputs[1].strip().splitlines()[-1] == "100"  # consumed.jsonl: every message
    final = outputs[3].strip().splitlines()
    rows = [line.split() for line in final if re.match(r"^n\d ", line)]
    assert sorted(row[0] for row in rows) == ["n1", "n2", "n4"]
    assert sorted(row[2] for row in rows) == ["follower", "follower", "leader"]
