"""An S3-compatible server on loopback for tests: moto's server mode (PyPI ``moto[server]``).

deltalake (object_store) talks to it as to S3, over plain HTTP
(``AWS_ALLOW_HTTP``), with ``conditional_put = "etag"`` so that two writers
that race for one Delta version cannot both win (moto implements S3's
``If-Match``/``If-None-Match`` conditional writes). The credentials are
moto's dummies; :data:`SECRET_ACCESS_KEY` is distinctive so a test can grep
logs for it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

#: Dummy credentials (moto accepts any); the secret is unusual so logs can be searched for it.
ACCESS_KEY_ID = "appliance-test-key-id"
SECRET_ACCESS_KEY = "s3cr3t-never-in-a-log-0f9c"
REGION = "us-east-1"
#: Seconds moto's server may take to start listening.
START_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class S3Server:
    """A running moto server: its endpoint, and a fresh bucket per :meth:`bucket`."""

    endpoint: str

    def storage_options(self) -> dict[str, str]:
        """deltalake's options for this server (what ``[lake] storage_options`` holds)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
            "conditional_put": "etag",
        }

    def toml_options(self) -> str:
        """``storage_options`` as an inline TOML table, for a ``[lake]`` section."""
        pairs = ", ".join(f'"{k}" = "{v}"' for k, v in self.storage_options().items())
        return f"storage_options = {{ {pairs} }}"

    def bucket(self) -> str:
        """A new empty bucket's name."""
        import boto3

        name = f"lake-{uuid.uuid4().hex[:12]}"
        client = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY, region_name=REGION,
        )  # fmt: skip
        client.create_bucket(Bucket=name)
        return name


def _serving(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's server in a process of its own on a free loopback port, for the whole session.

    Not moto's in-process ThreadedMotoServer: deltalake calls that hold the GIL
    while they wait for S3 (``DeltaTable.is_deltatable``) would starve it.
    """
    from tests.support.ports import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not _serving(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"moto's server did not start (moto[server] installed?):\n"
                            f"{log.read_text()[-2000:]}")  # fmt: skip
            time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
