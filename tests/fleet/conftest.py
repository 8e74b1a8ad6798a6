"""The fleet tests' fixtures from elsewhere: the Go sender (tests/interop)."""

from tests.interop.test_fluent_logger_golang import go_sender  # noqa: F401 -- a fixture
