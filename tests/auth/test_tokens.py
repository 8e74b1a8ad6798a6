"""API token look-up: selector finds the row, only the full hash admits."""

from __future__ import annotations

from pathlib import Path

from auth.database import open_database
from auth.settings import AuthSettings
from auth.tokens import SELECTOR_CHARS, TOKEN_PREFIX


def test_selector_with_a_wrong_remainder_is_refused(tmp_path: Path) -> None:
    with open_database(AuthSettings.under(tmp_path)) as database:
        store = database.tokens
        _, token = store.add("app", "ingest", ["web."], actor="test")
        grant = store.verify(token)
        assert grant is not None
        assert grant.name == "app"
        keep = len(TOKEN_PREFIX) + SELECTOR_CHARS
        forged = token[:keep] + ("A" if token[keep] != "A" else "B") + token[keep + 1 :]
        assert store.verify(forged) is None
        assert store.verify(TOKEN_PREFIX + "x" * SELECTOR_CHARS) is None
        store.revoke("app", actor="test")
        assert store.verify(token) is None
