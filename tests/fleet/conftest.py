"""The S3-compatible server fixture for the fleet tests (tests/s3server.py)."""

from tests.s3server import s3_server

__all__ = ["s3_server"]
