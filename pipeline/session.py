"""Finds Java and PySpark and builds the SparkSession (or says clearly what is missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17


class MissingRuntime(RuntimeError):
    """Java or PySpark is missing: the message says what to install."""


def find_java_home() -> str:
    """JAVA_HOME if it holds bin/java, else the JDK/JRE of ``java`` on PATH; checks the version."""
    home = os.environ.get("JAVA_HOME")
    java = None
    if home and (Path(home) / "bin" / "java").exists():
        java = str(Path(home) / "bin" / "java")
    else:
        found = shutil.which("java")
        if found is None:
            raise MissingRuntime(
                "pipeline: no Java found (JAVA_HOME unset and no java on PATH); Spark 4 needs Java"
                f" {MIN_JAVA}+: install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
            )
        java = str(Path(found).resolve())
        home = str(Path(java).parent.parent)
    result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    match = re.search(r'version "(\d+)', result.stderr + result.stdout)
    if match is None or int(match.group(1)) < MIN_JAVA:
        seen = match.group(1) if match else "unknown"
        raise MissingRuntime(
            f"pipeline: {java} is Java {seen}; Spark 4 needs Java {MIN_JAVA}+ (set JAVA_HOME)"
        )
    return home


def check_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise MissingRuntime(
            "pipeline: PySpark is not installed: pip install -e '.[spark]' (or 'skipmq[spark]')"
        ) from exc


SOCKET_TIMEOUT_KEY = "spark.python.authenticate.socketTimeout"


def _submitted_conf_has(master: str | None, key: str) -> bool:
    """Whether spark-submit (``master`` None) already set ``key``."""
    if master:
        return False
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return bool(SparkConf().contains(key))


def _local_driver(master: str | None) -> bool:
    """Whether the job runs Spark in local mode with no driver address set: ``master`` local, or
    (None: under spark-submit) the master and settings spark-submit gave."""
    if master:
        return master.startswith("local")
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # spark-submit's JVM: its settings are system properties
    conf = SparkConf()
    return conf.get("spark.master", "").startswith("local") and not conf.contains("spark.driver.host")


def build_session(
    master: str | None, app_name: str = "skipmq-pipeline", shuffle_partitions: int = 1
) -> SparkSession:
    """A session for ``master`` (None: whatever spark-submit configured), with the pipeline's
    sources registered and dynamic partition overwrite on (``pipeline.sinks``)."""
    check_pyspark()
    os.environ["JAVA_HOME"] = find_java_home()
    # executors' Python workers run this interpreter (the one with the pipeline installed)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pipeline.sources import MetricsDataSource, SnapshotDataSource

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if not _submitted_conf_has(master, SOCKET_TIMEOUT_KEY):
        # a Python worker (the sources' readers) must connect back to the JVM within this; Spark's
        # 15 s default killed the streaming query on a busy 2-core machine (load 11-22 seen:
        # "Python worker failed to connect back"): a job that dies under load is worse than a
        # slow start (spark-submit --conf sets another)
        builder = builder.config(SOCKET_TIMEOUT_KEY, "120s")
    if _local_driver(master):
        # the driver (and, in local mode, the executors in it) listens on loopback only, not on
        # the machine's external address; a Spark cluster needs a reachable driver: under
        # spark-submit, Spark's own spark.driver.host / bindAddress apply (docs/pipeline.md)
        builder = builder.config("spark.driver.host", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        # Spark's regular expressions recurse deeply on long plan strings; the default 1 MB thread
        # stack overflows in the stream execution thread
        .config("spark.driver.extraJavaOptions", "-Xss16m")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SnapshotDataSource)
    spark.dataSource.register(MetricsDataSource)
    return spark
