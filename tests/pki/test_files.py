"""PKI files: unique temporary names, never through a symlink, modes from the start."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pki import files
from pki.authority import CertificateAuthority, PkiPaths
from pki.errors import PkiError
from pki.files import read_private, write_private, write_public


def test_modes_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_public(tmp_path / "a.pem", b"public")
        write_private(tmp_path / "a.key", b"secret")
    finally:
        os.umask(old)
    assert (tmp_path / "a.pem").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "a.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a.key").read_bytes() == b"secret"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.key", "a.pem"]  # no temporary left


def test_a_symlink_target_is_refused_and_what_it_points_to_is_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    link = tmp_path / "ca.key"
    os.symlink(victim, link)
    for write in (write_private, write_public):
        with pytest.raises(PkiError, match="is a symbolic link: refusing to replace it"):
            write(link, b"new")
    assert victim.read_bytes() == b"keep me"
    assert link.is_symlink()


def test_a_symlink_planted_at_the_temporary_name_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Someone who guessed the temporary name (here: made predictable) plants a link
    # there: the write fails rather than write the key through it.
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "guessed")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.symlink(victim, tmp_path / ".ca.key.guessed.tmp")
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "ca.key", b"secret")
    assert victim.read_bytes() == b"keep me"
    assert not (tmp_path / "ca.key").exists()


def test_concurrent_writers_of_one_file_use_their_own_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "index.json"
    payloads = [bytes([ord("a") + n]) * 200_000 for n in range(4)]
    errors: list[OSError] = []

    def writer(data: bytes) -> None:
        try:
            for _ in range(25):
                write_public(target, data)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(data,)) for data in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert target.read_bytes() in payloads  # whole: one writer's file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "crl.pem").mkdir()  # os.replace cannot put a file over a directory
    with pytest.raises(IsADirectoryError):
        write_public(tmp_path / "crl.pem", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["crl.pem"]


def test_keys_are_not_read_through_a_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "real.key"
    write_private(secret, b"secret")
    assert read_private(secret) == b"secret"
    os.symlink(secret, tmp_path / "link.key")
    with pytest.raises(PkiError, match="is a symbolic link: refusing to read a key through it"):
        read_private(tmp_path / "link.key")

    ca = CertificateAuthority(PkiPaths(tmp_path / "pki"))
    ca.create()
    moved = tmp_path / "moved-ca.key"
    ca.paths.ca_key.rename(moved)
    os.symlink(moved, ca.paths.ca_key)
    with pytest.raises(PkiError, match="refusing to read a key through it"):
        ca.issue_client("web-01")
