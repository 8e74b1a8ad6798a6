"""The auth package's exceptions: each ``str()`` explains the problem to an operator.

No message ever contains a password, a shared key, key-file bytes or a
database URL's password.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "ConflictError",
    "DatabaseError",
    "InvalidValueError",
    "NotFoundError",
    "SchemaError",
    "SecretKeyError",
]


class AuthError(Exception):
    """An auth-database operation failed; ``str()`` says why."""


class NotFoundError(AuthError):
    """No user, shared key or client network has that name."""


class ConflictError(AuthError):
    """The name is taken, or the change would break a rule (a key in use, ...)."""


class InvalidValueError(AuthError):
    """A name, CIDR or secret is not acceptable."""


class DatabaseError(AuthError):
    """The database cannot be reached or failed (the message names no secret)."""


class SchemaError(AuthError):
    """The database schema is not the one this appliance needs (run ``appliance db upgrade``)."""


class SecretKeyError(AuthError):
    """The secret key file is missing or unusable, or a ciphertext fails authentication."""
