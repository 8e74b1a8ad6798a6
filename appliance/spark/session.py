"""Build a Spark session: over Spark Connect, or a classic local session with delta-spark.

Everything after :func:`build_session` is the same for both: the appliance
uses only the DataFrame/SQL API that Spark Connect and classic Spark share
(``spark.sql``, ``spark.read``, ``createOrReplaceTempView``, ``toArrow``).

* **Spark Connect** (``sc://host:port``): an Apache Spark 4 server with
  delta-spark, or Sail. Needs only the ``spark`` extra (``pyspark-client``).
  Tested here against Sail.
* **Classic** (no URL): a local JVM session configured with delta-spark's
  SQL extension and catalog. Needs the ``spark-classic`` extra (full
  ``pyspark`` and ``delta-spark``) and Java. With ``classic_delta_jars =
  "download"`` Delta's jars are fetched once from Maven Central through
  ``spark.jars.packages`` (cached under ``~/.ivy2``); with ``"classpath"``
  they must already be on Spark's classpath. This path cannot run on the
  machine the tests run on (no Maven Central): it is untested here.

Every session works in UTC (``spark.sql.session.timeZone``), so minutes and
dates computed by the jobs do not depend on the machine's time zone.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from appliance.spark.errors import SparkSetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from appliance.config import SparkConfig

__all__ = ["CONNECT_DEFAULT_PORT", "build_session", "check_reachable", "is_connect"]

#: Spark Connect's default port.
CONNECT_DEFAULT_PORT: Final = 15002
#: Seconds to wait for the Spark Connect port to accept a TCP connection.
CONNECT_PROBE_TIMEOUT_SECONDS: Final = 5.0

_DELTA_EXTENSION: Final = "io.delta.sql.DeltaSparkSessionExtension"
_DELTA_CATALOG: Final = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def check_reachable(url: str, timeout: float = CONNECT_PROBE_TIMEOUT_SECONDS) -> None:
    """Fail fast when nothing listens at a Spark Connect URL.

    pyspark's Connect client retries an unreachable server for minutes; one
    TCP connect turns that into a prompt, clear error.

    Raises:
        SparkSetupError: the URL is malformed or the port does not answer.
    """
    parts = urlsplit(url.split(";", 1)[0])
    if parts.scheme != "sc" or not parts.hostname:
        raise SparkSetupError(f"not a Spark Connect URL (sc://HOST:PORT): {url!r}")
    port = parts.port or CONNECT_DEFAULT_PORT
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            pass
    except OSError as exc:
        raise SparkSetupError(
            f"cannot reach Spark Connect at {parts.hostname}:{port}: {exc.strerror or exc}"
        ) from None


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` talks Spark Connect (rather than a local JVM)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def build_session(settings: SparkConfig, remote: str | None = None) -> SparkSession:
    """A session on ``remote`` (or ``settings.remote``), else a classic local one.

    Raises:
        SparkSetupError: pyspark or delta-spark is missing, or the server
            cannot be reached.
    """
    url = remote or settings.remote
    try:
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise SparkSetupError(
            f"pyspark is not installed ({exc}): install the appliance's 'spark' extra"
        ) from None
    if url:
        check_reachable(url)
        builder = SparkSession.builder.remote(url)
    else:
        builder = _classic_builder(settings)
    try:
        spark = builder.getOrCreate()
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    except PySparkException as exc:
        raise SparkSetupError(f"cannot start a Spark session: {exc}") from exc
    return spark


def _classic_builder(settings: SparkConfig) -> SparkSession.Builder:
    """A local JVM session with Delta (untested here: see the module docstring)."""
    try:
        from delta import configure_spark_with_delta_pip
    except ImportError:
        raise SparkSetupError(
            "a local Spark session needs full pyspark and delta-spark (the 'spark-classic' "
            "extra) and Java; or give a Spark Connect URL with --remote sc://HOST:PORT"
        ) from None
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.classic_master)
        .appName("appliance")
        .config("spark.sql.extensions", _DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", _DELTA_CATALOG)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if settings.classic_delta_jars == "download":
        # Adds io.delta:delta-spark_<scala> of the installed delta-spark to
        # spark.jars.packages: Ivy downloads it once into ~/.ivy2.
        builder = configure_spark_with_delta_pip(builder)
    return builder
