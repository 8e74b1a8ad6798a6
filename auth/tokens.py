"""API tokens of the WebSocket listener (docs/websocket.md): bearer secrets, stored hashed.

* :class:`ApiToken` - one token: a unique name, the SHA-256 of its secret,
  a scope (``ingest`` sends events; ``admin`` may also watch the live tail),
  the tag prefixes it may write under, and when it was created, revoked and
  last used. On the same declarative :class:`~auth.models.Base` as the other
  auth tables; created by Alembic revision ``0003``.
* :class:`TokenStore` - ``appliance token add|list|revoke`` and the look-up
  the WebSocket listener makes at every handshake (read afresh each time, so
  a revocation applies to the next connection of a running service).

Unlike forward passwords, which the handshake needs raw, a token is a bearer
secret that never needs to be recovered: only its SHA-256 is stored, and a
lost token is revoked and replaced. A token is 32 random bytes (so a plain
hash, without salt or stretching, is enough: there is nothing to guess), in
URL-safe base64 behind the ``apt_`` prefix that makes it easy to spot in a
leaked file. Every method raises only :class:`auth.errors.AuthError`
subclasses; no message, log or audit entry ever holds a token.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from typing import Final, Literal, get_args

from sqlalchemy import JSON, LargeBinary, String, select
from sqlalchemy.orm import Mapped, mapped_column

from auth.errors import ConflictError, InvalidValueError
from auth.models import NAME_LENGTH, Base, UtcDateTime, utc_now
from auth.principals import check_principal_name
from auth.records import TokenGrant, TokenInfo
from auth.tablestore import TableStore

__all__ = [
    "MAX_TAG_PREFIXES",
    "TOKEN_PREFIX",
    "ApiToken",
    "Scope",
    "TokenStore",
    "generate_token",
    "hash_token",
]

#: What a token may do: send events, or also read the live tail.
Scope = Literal["ingest", "admin"]
SCOPES: Final[tuple[str, ...]] = get_args(Scope)
#: Random bytes in a token.
TOKEN_BYTES: Final = 32
#: The text every token starts with.
TOKEN_PREFIX: Final = "apt_"  # noqa: S105 -- a marker, not a secret
#: Longest token text accepted at all (longer input is refused unhashed).
MAX_TOKEN_CHARS: Final = 256
#: Tag prefixes one token may carry, and the longest one, in characters.
MAX_TAG_PREFIXES: Final = 64
MAX_TAG_PREFIX_CHARS: Final = 255
#: Bytes of a SHA-256 digest.
_HASH_BYTES: Final = 32
#: Characters of the token (after ``apt_``) that select its row: 72 random bits.
SELECTOR_CHARS: Final = 12


class ApiToken(Base):
    """A bearer token of the WebSocket listener, stored as its SHA-256 only."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH), unique=True)
    #: The first characters of the token's random part: finds the row without
    #: comparing anything secret in SQL (the split-token scheme).
    token_selector: Mapped[str] = mapped_column(String(SELECTOR_CHARS), unique=True)
    #: SHA-256 of the whole token text, compared only with hmac.compare_digest;
    #: the token itself is never stored.
    token_hash: Mapped[bytes] = mapped_column(LargeBinary(_HASH_BYTES))
    #: "ingest" or "admin".
    scope: Mapped[str] = mapped_column(String(16))
    #: Tags the token may write under, as prefixes; empty: any tag.
    tag_prefixes: Mapped[list[str]] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, default=utc_now)
    #: Set by ``appliance token revoke``; refused from the next handshake on.
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    #: The last handshake that presented it.
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


def _info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        row.name,
        row.scope,
        tuple(row.tag_prefixes or ()),
        row.created_at,
        row.revoked_at,
        row.last_used_at,
    )


def generate_token() -> str:
    """A new random token text (``apt_`` + 43 characters of URL-safe base64)."""
    raw = secrets.token_bytes(TOKEN_BYTES)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def token_selector(token: str) -> str:
    """The non-secret part of a token that locates its row."""
    return token[len(TOKEN_PREFIX) : len(TOKEN_PREFIX) + SELECTOR_CHARS]


def hash_token(token: str) -> bytes:
    """The SHA-256 of a token's text: what the database keeps."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _check_prefixes(prefixes: Sequence[str]) -> list[str]:
    if len(prefixes) > MAX_TAG_PREFIXES:
        raise InvalidValueError(f"a token takes at most {MAX_TAG_PREFIXES} tag prefixes")
    cleaned: list[str] = []
    for prefix in prefixes:
        if not prefix or len(prefix) > MAX_TAG_PREFIX_CHARS or not prefix.isprintable():
            raise InvalidValueError(
                f"a tag prefix needs 1 to {MAX_TAG_PREFIX_CHARS} printable characters"
            )
        if prefix not in cleaned:
            cleaned.append(prefix)
    return cleaned


class TokenStore(TableStore):
    """The ``api_tokens`` table of the auth database.

    Args:
        url: SQLAlchemy URL of the auth database (schema at head: see
            :func:`auth.schema.prepare`).
        pool_size: connections kept open.
    """

    def add(
        self, name: str, scope: str, tag_prefixes: Sequence[str] = (), *, actor: str
    ) -> tuple[TokenInfo, str]:
        """Create a token; returns it with its secret text, which is never available again.

        Raises:
            InvalidValueError: a bad name, scope or tag prefix.
            ConflictError: the name is taken (revoked tokens too).
        """
        name = check_principal_name("token", name)
        if scope not in SCOPES:
            raise InvalidValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
        prefixes = _check_prefixes(tag_prefixes)
        token = generate_token()
        with self._write() as session:
            taken = session.scalar(select(ApiToken).where(ApiToken.name == name))
            if taken is not None:
                state = "revoked" if taken.revoked_at else "active"
                raise ConflictError(f"a token named {name!r} exists already ({state})")
            row = ApiToken(
                name=name,
                token_selector=token_selector(token),
                token_hash=hash_token(token),
                scope=scope,
                tag_prefixes=prefixes,
                created_at=utc_now(),
            )
            session.add(row)
            detail = f"scope {scope}; tag prefixes {', '.join(prefixes) or '(any)'}"
            self._audit(session, "token.add", name, actor=actor, detail=detail)
            session.flush()
            return _info(row), token

    def list(self) -> list[TokenInfo]:
        """Every token, active and revoked, by name."""
        return self._all_by_name(ApiToken, ApiToken.name, _info)

    def revoke(self, name: str, *, actor: str) -> TokenInfo:
        """Refuse ``name`` from the next handshake on.

        Raises:
            NotFoundError: no such token.
            ConflictError: it is revoked already.
        """
        return self._revoke_named(
            ApiToken, ApiToken.name, name, _info, what="token", action="token.revoke", actor=actor
        )

    def verify(self, token: str) -> TokenGrant | None:
        """What an active ``token`` allows, or None: the listener's question (blocking).

        The row is found by the token's selector (its first random characters,
        not a secret on their own) and the whole token's SHA-256 is then
        compared with :func:`hmac.compare_digest`, so no secret-derived value is
        ever compared by SQL; a hit records ``last_used_at``.
        """
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = hash_token(token)
        with self._write() as session:
            row = session.scalar(
                select(ApiToken).where(ApiToken.token_selector == token_selector(token))
            )
            if row is None or not hmac.compare_digest(row.token_hash, digest):
                return None
            if row.revoked_at is not None:
                return None
            row.last_used_at = utc_now()
            return TokenGrant(row.name, row.scope, tuple(row.tag_prefixes or ()))
