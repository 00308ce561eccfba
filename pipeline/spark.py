"""SparkSession creation for the pipeline: quiet, UI off, any master (local or a cluster URL)."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

# Spark's default log4j2 setup prints INFO/WARN lines on stderr, which is our progress channel.
_LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# PySpark counts as a shell: Spark resets the root level to its main class's (WARN when unset).
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


def _log4j2_config() -> Path:
    """Write the quiet log4j2 configuration once per machine and return its path."""
    path = Path(tempfile.gettempdir()) / "quorumq-pipeline-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2_PROPERTIES:
        path.write_text(_LOG4J2_PROPERTIES)
    return path


def create_session(
    master: str, app_name: str = "quorumq-pipeline", shuffle_partitions: int = 4
) -> SparkSession:
    """Start (or reuse) a SparkSession on `master`; executors run this interpreter's Python.

    With a cluster URL (anything but `local...`) quorumq's own packages are zipped and shipped
    with the job (`addPyFile`), so workers need no quorumq install, only a Python with its
    dependencies (cbor2, pyarrow); PYSPARK_PYTHON names that interpreter on the workers
    (default: this one, at the same path).
    """
    # pandas 3 works for what we use (Arrow batches); the version nag would pollute stderr.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    java_options = f"-Dlog4j2.configurationFile=file:{_log4j2_config()}"
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        global _SHIPPED
        if _SHIPPED is None:
            _SHIPPED = package_zip()
        session.sparkContext.addPyFile(str(_SHIPPED))
    return session


_SHIPPED: Path | None = None


SHIPPED_PACKAGES = ("fifo", "raft", "pipeline", "cluster")  # raft.sim runs cluster.node's timers


def package_zip(directory: Path | None = None) -> Path:
    """A zip of quorumq's packages (sources only) for the executors' Python path."""
    root = Path(__file__).resolve().parent.parent
    target = Path(directory or tempfile.mkdtemp(prefix="quorumq-ship-")) / "quorumq-packages.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            for path in sorted((root / package).rglob("*")):
                if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                    archive.write(path, str(path.relative_to(root)))
    return target
