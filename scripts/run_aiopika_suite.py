"""aio-pika's own test suite, from its source distribution, against quorumq's AMQP listener.

Downloads aio-pika's sdist (the version pinned in pyproject.toml) once into a cache directory
(`$QUORUMQ_CACHE`, else `~/.cache/quorumq`; never inside the repository), unpacks it, builds a
virtualenv there with its test dependencies (aiomisc-pytest's plugin must not leak into our own
suite), starts a fresh local 3-node cluster with `amqp_guest = true` on the newest machine
version, and runs `pytest` on their unchanged `tests/` with `aiopika_quorumq_plugin.py`, which
points their Docker fixture at a node's AMQP port. Their own `aio_pika` package (from the sdist)
is the one under test. Each test's outcome is classified (see `aiopika_classes.py`) and a JSON
summary per module is written:

    python scripts/run_aiopika_suite.py --json /tmp/aiopika.json               # the whole suite
    python scripts/run_aiopika_suite.py tests/test_message.py -k 'not robust'  # a slice

The exit status is 0 when at least `--min-pass-rate` of the tests that apply to quorum queues
pass and no test listed as one that must pass failed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS.parent))
sys.path.insert(0, str(SCRIPTS))

import aiopika_classes  # noqa: E402
from bench_amqp import start  # noqa: E402  (a sibling script: the same cluster)

import fifo  # noqa: E402
from cluster.launcher import LocalCluster  # noqa: E402

VERSION = "10.2.1"  # pyproject.toml pins aio-pika==10.2.1
# aio-pika's `test` dependency group, pinned to what this was last run with
TEST_DEPENDENCIES = (
    "aiormq==7.2.4", "pamqp==4.0.1", "yarl==1.25.1", "aiomisc==18.0.37",
    "aiomisc-pytest==2.0.0", "shortuuid", "pytest==9.2.0", "pytest-timeout==2.4.0",
    "timeout-decorator",
)  # fmt: skip
PIP_TIMEOUT_S = 600
TEST_TIMEOUT_S = 60  # per test (pytest-timeout); their pool test needs 20 s by design


def cache_dir() -> Path:
    """Where the sdist, its unpacked tree and the test virtualenv live."""
    base = os.environ.get("QUORUMQ_CACHE") or Path.home() / ".cache" / "quorumq"
    return Path(base) / f"aio-pika-{VERSION}"


def fetch_sdist(cache: Path) -> Path:
    """aio-pika's unpacked source tree (downloaded with pip on first use)."""
    tree = cache / f"aio_pika-{VERSION}"
    if (tree / "tests" / "conftest.py").exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"aio_pika-{VERSION}.tar.gz"
    if not archive.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "aio-pika",
             "-d", str(cache), f"aio-pika=={VERSION}"],
            check=True, timeout=PIP_TIMEOUT_S, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    if not (tree / "tests" / "conftest.py").exists():
        raise RuntimeError(f"{archive} has no tests/conftest.py")
    return tree


def test_python(cache: Path) -> Path:
    """A virtualenv's python with aio-pika's sdist and test dependencies (made on first use)."""
    venv = cache / "venv"
    python = venv / "bin" / "python"
    marker = venv / "installed.txt"
    archive = cache / f"aio_pika-{VERSION}.tar.gz"
    wanted = "\n".join([str(archive), *TEST_DEPENDENCIES])
    if marker.exists() and marker.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(archive), *TEST_DEPENDENCIES],
        check=True, timeout=PIP_TIMEOUT_S,
    )  # fmt: skip
    marker.write_text(wanted)
    return python


def amqp_port(cluster: LocalCluster) -> int:
    """The AMQP port of the cluster's first node."""
    port = cluster.config.nodes[0].amqp_port
    if port is None:
        raise RuntimeError("the cluster's nodes have no amqp_port")
    return port


def run_pytest(
    tree: Path, python: Path, ports: dict[str, int], args: list[str], junit: Path
) -> int:
    """aio-pika's pytest on `args` (default: their whole tests/) against `ports` (amqp, amqps)."""
    env = dict(os.environ, QUORUMQ_AMQP_PORT=str(ports["amqp"]))
    if "amqps" in ports:
        env["QUORUMQ_AMQPS_PORT"] = str(ports["amqps"])
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(SCRIPTS)])
    env.pop("PYTEST_ADDOPTS", None)
    command = [
        str(python), "-m", "pytest", "-p", "aiopika_quorumq_plugin", "-p", "no:cacheprovider",
        "-o", "log_cli=false", f"--timeout={TEST_TIMEOUT_S}", f"--junitxml={junit}", "-q",
        "-rN", *(args or ["tests"]),
    ]  # fmt: skip
    return subprocess.run(command, cwd=tree, env=env, check=False).returncode


def node_id(classname: str, name: str) -> str:
    """pytest's node id from a JUnit test case (`tests.test_x.TestY`, `test_z[connect]`)."""
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "::".join(["/".join(parts[: module + 1]) + ".py", *parts[module + 1 :], name])


def outcomes(junit: Path) -> list[dict[str, str]]:
    """Each test case of a JUnit XML report: node id, outcome, and the failure's first line."""
    if not junit.exists():
        raise RuntimeError("aio-pika's pytest wrote no report (see its output above)")
    cases = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, message, report = "passed", "", ""
        for tag, name in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome = name
                message = (element.get("message") or "").strip().split("\n")[0][:300]
                report = f"{element.get('message') or ''}\n{element.text or ''}"
                break
        test = node_id(case.get("classname", ""), case.get("name", ""))
        cases.append({"id": test, "outcome": outcome, "message": message, "report": report})
    return cases


def summarise(cases: list[dict[str, str]]) -> dict[str, Any]:
    """Per module: passed, failed (with why), not applicable (with why), needing exchanges."""
    modules: dict[str, dict[str, Any]] = {}
    for case in cases:
        module = case["id"].split("::", 1)[0]
        entry = modules.setdefault(module, {
            "passed": 0, "failed": [], "not_applicable": [], "needs_exchanges": [], "skipped": 0,
        })  # fmt: skip
        verdict, reason = aiopika_classes.classify(case["id"], case["outcome"], case["report"])
        if verdict == "passed":
            entry["passed"] += 1
        elif verdict == "skipped":
            entry["skipped"] += 1
        else:
            entry[verdict].append({"test": case["id"], "outcome": case["outcome"],
                                   "why": reason or case["message"]})  # fmt: skip
    applicable_passed = sum(entry["passed"] for entry in modules.values())
    applicable_failed = sum(len(entry["failed"]) for entry in modules.values())
    applicable = applicable_passed + applicable_failed
    return {
        "aio_pika": VERSION, "modules": modules,
        "totals": {
            "tests": len(cases), "applicable": applicable, "passed": applicable_passed,
            "failed": applicable_failed,
            "not_applicable": sum(len(e["not_applicable"]) for e in modules.values()),
            "needs_exchanges": sum(len(e["needs_exchanges"]) for e in modules.values()),
            "skipped": sum(e["skipped"] for e in modules.values()),
            "pass_rate": round(applicable_passed / applicable, 4) if applicable else None,
        },
    }  # fmt: skip


def verdict(summary: dict[str, Any], cases: list[dict[str, str]], min_rate: float) -> list[str]:
    """Why the run fails its bar (empty: it passes)."""
    problems = []
    rate = summary["totals"]["pass_rate"]
    if rate is None or rate < min_rate:
        problems.append(f"pass rate {rate} of applicable tests is below {min_rate}")
    for case in cases:
        if case["outcome"] != "passed" and aiopika_classes.must_pass(case["id"]):
            problems.append(f"{case['id']} must pass: {case['outcome']} {case['message']}")
    return problems


def main() -> int:
    """Fetch, start a cluster, run their tests, write and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the per-module summary here")
    parser.add_argument("--junit", type=Path, help="keep their JUnit XML report here")
    parser.add_argument("--reclassify", type=Path, help="only classify this JUnit XML report")
    parser.add_argument("--min-pass-rate", type=float, default=0.8)
    parser.add_argument(
        "--machine-version",
        type=int,
        choices=sorted({*fifo.SUPPORTED_VERSIONS, *fifo.UNRELEASED_VERSIONS}),
        help="run the clusters on this machine version (default: the newest released; "
        "an unreleased one such as 4, with exchanges, is allowed explicitly)",
    )
    args, pytest_args = parser.parse_known_args()  # the rest goes to their pytest
    cases = (
        outcomes(args.reclassify)
        if args.reclassify
        else run_suite(pytest_args, args.junit, args.machine_version)
    )
    summary = summarise(cases)
    problems = verdict(summary, cases, args.min_pass_rate)
    summary["problems"] = problems
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    print(json.dumps({"totals": summary["totals"], "problems": problems}, indent=1))
    return 1 if problems else 0


def run_suite(
    pytest_args: list[str], keep_junit: Path | None, machine_version: int | None = None
) -> list[dict[str, str]]:
    """Start a cluster (and a TLS one for their test_amqps.py) on `machine_version` (None: the
    newest released), run their pytest, stop them."""
    cache = cache_dir()
    tree, python = fetch_sdist(cache), test_python(cache)
    args = [arg for arg in pytest_args if arg != "--"]
    wants_tls = not any(arg.startswith("tests") for arg in args) or any(
        "test_amqps" in arg for arg in args
    )
    with tempfile.TemporaryDirectory(prefix="qq-aiopika-") as tmp:
        junit = Path(tmp) / "junit.xml"
        clusters = [start(Path(tmp) / "D", machine_version=machine_version)]
        try:
            ports = {"amqp": amqp_port(clusters[0])}
            if wants_tls:  # their amqps tests connect with TLS to RabbitMQ's port 5671
                clusters.append(start(Path(tmp) / "TLS", tls=True, machine_version=machine_version))
                ports["amqps"] = amqp_port(clusters[1])
            run_pytest(tree, python, ports, args, junit)
        finally:
            for cluster in clusters:
                cluster.stop()
        if keep_junit and junit.exists():
            shutil.copyfile(junit, keep_junit)
        return outcomes(junit)


if __name__ == "__main__":
    sys.exit(main())
