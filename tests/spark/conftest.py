"""Sail, in process: a Spark Connect server for the whole session, and helpers.

The PySpark code under test is the appliance's own (the same code a classic
delta-spark session runs); Sail reads the Delta tables natively.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pysail.spark import SparkConnectServer


@pytest.fixture(scope="session")
def sail_url() -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a Sail server on a free port, stopped at the end."""
    server = SparkConnectServer("127.0.0.1", 0)
    server.start(background=True)
    address = server.listening_address
    assert address is not None, "Sail did not start listening"
    host, port = address
    try:
        yield f"sc://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark(sail_url: str) -> Iterator[Any]:
    """A Spark Connect session on the Sail server, built as the appliance builds one."""
    from appliance.config import SparkConfig
    from appliance.spark.session import build_session

    session = build_session(SparkConfig(), sail_url)
    try:
        yield session
    finally:
        session.stop()
