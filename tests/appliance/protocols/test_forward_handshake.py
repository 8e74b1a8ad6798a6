"""The forward handshake's digests, PING parsing and verdicts (docs/forward.md)."""

from __future__ import annotations

import msgpack
import pytest

from appliance.blocks.text import MAX_HOST_BYTES
from appliance.protocols.errors import LocalProtocolError, ProtocolViolation
from appliance.protocols.forward import (
    MAX_PING_BYTES,
    EventsReceived,
    ForwardEvent,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    PingReceived,
)
from appliance.protocols.forward.handshake import (
    MAX_USERNAME_BYTES,
    REASON_SHARED_KEY,
    REASON_USER,
    Helo,
    InvalidPing,
    Ping,
    password_digest,
    ping_digest,
    pong_bytes,
    verify_ping,
)
from tests.appliance.protocols import support
from tests.appliance.protocols.support import violation

NONCE = bytes(range(16))
AUTH = bytes(range(16, 32))
SALT = b"salt"
KEY = b"foobar1"
PING_VECTOR = (
    "4266e1f766905ee143b163e117a2bd38e71edc715a2703f3c3d04d9ed3a291b1"
    "5a80f2e9ecc93359fdb770b61d03b09efa563841cae76e41366086690aef871c"
)
PONG_VECTOR = (
    "24199a36c4223f164cd40c4595c8c9415401620f55c3f7af8b83c5e81cf834d7"
    "eced52d3591755701f50c2b4e90f6a38533629c81692819a390956d285d1d3c8"
)
PASSWORD_VECTOR = (
    "3a382e8eb712856d06d44371c527d2552c4cd35901c0580bc07d8b07e547e7d9"
    "c422ffd8c8fe0a18d06804e73e1807da86c417446962e7b17b4a15cc086df34f"
)


def test_ping_digest_vector() -> None:
    assert ping_digest(SALT, "client.example", NONCE, KEY) == PING_VECTOR


def test_pong_digest_vector() -> None:
    assert ping_digest(SALT, "server.example", NONCE, KEY) == PONG_VECTOR


def test_password_digest_vector() -> None:
    assert password_digest(AUTH, "tagomoris", b"fluentd") == PASSWORD_VECTOR


def ping(digest: str | bytes = PING_VECTOR, user: str = "", password: str = "") -> Ping:
    parsed = Ping.parse(["PING", "client.example", "salt", digest, user, password])
    assert parsed is not None
    return parsed


def verify(p: Ping, **kwargs: object):
    settings = {
        "nonce": NONCE, "auth_salt": AUTH, "shared_keys": [KEY], "users_required": False,
        "password": None,
    }  # fmt: skip
    settings.update(kwargs)
    return verify_ping(p, **settings)  # type: ignore[arg-type]


def test_helo_packs_nonce_and_auth_as_bin() -> None:
    message = msgpack.unpackb(Helo(NONCE, AUTH).to_bytes(), raw=True)
    assert message == [b"HELO", {b"nonce": NONCE, b"auth": AUTH, b"keepalive": True}]
    # bin, not str: npm fluent-logger only sends a password when auth is bin.
    assert b"\xc4\x10" + NONCE in Helo(NONCE, AUTH).to_bytes()


def test_good_shared_key_is_accepted_and_pong_signed_with_server_name() -> None:
    verdict = verify(ping())
    assert verdict.ok
    pong = msgpack.unpackb(
        pong_bytes(verdict, ping(), server_hostname="server.example", nonce=NONCE)
    )
    assert pong == ["PONG", True, "", "server.example", PONG_VECTOR]


@pytest.mark.parametrize("digest", ["", PING_VECTOR[:64], PING_VECTOR.upper(), "x" * 128])
def test_empty_short_or_wrong_digest_fails(digest: str) -> None:
    verdict = verify(ping(digest))
    assert not verdict.ok
    assert verdict.reason == REASON_SHARED_KEY
    pong = msgpack.unpackb(pong_bytes(verdict, ping(digest), server_hostname="s", nonce=NONCE))
    assert pong == ["PONG", False, "shared_key mismatch", "", ""]


def test_any_key_of_a_rotation_is_accepted_and_signs_the_pong() -> None:
    verdict = verify(ping(), shared_keys=[b"new-key", KEY])
    assert verdict.ok
    assert verdict.shared_key == KEY


def test_user_with_right_password() -> None:
    verdict = verify(ping(user="tagomoris", password=PASSWORD_VECTOR), users_required=True,
                     password=b"fluentd")  # fmt: skip
    assert verdict.ok
    assert verdict.username == "tagomoris"


@pytest.mark.parametrize(
    ("user", "digest", "password", "allowed"),
    [
        ("tagomoris", PASSWORD_VECTOR, b"wrong", None),  # wrong password
        ("tagomoris", PASSWORD_VECTOR, None, None),  # unknown or disabled user
        ("tagomoris", "", b"fluentd", None),  # empty digest
        ("tagomoris", PASSWORD_VECTOR[:10], b"fluentd", None),  # truncated digest
        ("tagomoris", PASSWORD_VECTOR, b"fluentd", frozenset({"someone-else"})),  # not allowed
        ("", "", None, None),  # no user where users are required
    ],
)
def test_user_refusals(user: str, digest: str, password: bytes | None, allowed) -> None:
    verdict = verify(ping(user=user, password=digest), users_required=True, password=password,
                     allowed_users=allowed)  # fmt: skip
    assert not verdict.ok
    assert verdict.reason == REASON_USER


def test_network_allowing_anonymous_skips_users() -> None:
    assert verify(ping(), users_required=True, allow_anonymous=True).ok


@pytest.mark.parametrize(
    "message",
    [
        ["PING", "h", "s", "d", "u"],  # five elements
        ["PONG", "h", "s", "d", "u", "p"],
        ["PING", 1, "s", "d", "u", "p"],
        {"PING": 1},
        None,
    ],
)
def test_malformed_ping_is_not_a_ping(message: object) -> None:
    assert Ping.parse(message) is None


def test_ping_fields_may_be_bin() -> None:
    parsed = Ping.parse(["PING", b"client.example", b"salt", PING_VECTOR.encode(), b"", b""])
    assert parsed is not None
    assert verify(parsed).ok


# -- the codec's handshake states ---------------------------------------------


def ping_bytes(digest: str = PING_VECTOR, user: str = "", password: str = "") -> bytes:
    return msgpack.packb(["PING", "client.example", "salt", digest, user, password])


def request(chunk: str) -> bytes:
    return msgpack.packb(["tag", [[1700000000, {"a": 1}]], {"chunk": chunk}])


def secured(auth: bytes = b"") -> ForwardServerConnection:
    return ForwardServerConnection(helo=Helo(NONCE, auth))


def test_handshake_then_events_split_at_every_byte() -> None:
    stream = ping_bytes() + request("c1")
    for cut in range(len(stream) + 1):
        codec = secured()
        events = feed_reads(codec, [stream[:cut], stream[cut:]])
        assert [type(e) for e in events] == [PingReceived]
        assert codec.state is ForwardState.AUTHENTICATING
        verdict = codec.check_ping(shared_keys=[KEY], users_required=False, password=None)
        pong, held = codec.finish_handshake(verdict, "server.example")
        assert msgpack.unpackb(pong)[:2] == ["PONG", True]
        assert [e.chunk.text() for e in held if isinstance(e, EventsReceived)] == ["c1"]
        assert codec.state is ForwardState.TRANSPORT_MSGPACK


def test_events_before_ping_are_refused_with_pong_false() -> None:
    codec = secured()
    error = refused(codec, request("early"))
    assert msgpack.unpackb(error.reply) == ["PONG", False, "invalid ping message", "", ""]


def test_json_form_is_refused_when_the_handshake_is_on() -> None:
    codec = secured()
    refused(codec, b'["tag", 1700000000, {"a": 1}]')


def test_failed_verdict_closes_with_the_reason() -> None:
    codec = secured(AUTH)
    codec.receive_data(ping_bytes(user="tagomoris", password="0" * 128))
    verdict = codec.check_ping(shared_keys=[KEY], users_required=True, password=b"fluentd")
    # The PONG false is the answer; the violation after it closes the connection.
    pong, (error,) = codec.finish_handshake(verdict, "server.example")
    assert msgpack.unpackb(pong) == [
        "PONG", False, "username/password mismatch", "", "",
    ]  # fmt: skip
    assert violation([error]).reason == "username/password mismatch"
    assert codec.state is ForwardState.CLOSED


def test_held_bytes_are_bounded_while_authenticating() -> None:
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=1000), helo=Helo(NONCE))
    codec.receive_data(ping_bytes())
    violation(codec.receive_data(b"\x90" * 2000), "1000 bytes sent before the PONG")


# -- strict PING strings, and what a peer may send before the PONG -------------


def ping_message(hostname: str | bytes = "client.example", user: str | bytes = "") -> bytes:
    return msgpack.packb(
        ["PING", hostname, "salt", PING_VECTOR, user, ""],
        use_bin_type=True,
        unicode_errors="surrogateescape",
    )


def feed_reads(codec: ForwardServerConnection, reads: list[bytes]) -> list[ForwardEvent]:
    return support.feed_reads(codec.receive_data, reads)


def refused(codec: ForwardServerConnection, data: bytes) -> ProtocolViolation:
    """Feed ``data``: it must end the events in a violation alone, and close the codec."""
    (error,) = codec.receive_data(data)
    assert isinstance(error, ProtocolViolation), error
    assert codec.state is ForwardState.CLOSED
    return error


@pytest.mark.parametrize(
    "hostname",
    [
        b"host\xff".decode("utf-8", "surrogateescape"),
        b"host\xff",
        b"\xed\xa0\x80",
        "h" * (MAX_HOST_BYTES + 1),
        "\u00e9" * 128,  # 256 bytes
    ],
    ids=["str-not-utf8", "bin-not-utf8", "surrogate-bytes", "too-long", "too-long-multibyte"],
)
def test_ping_with_a_bad_client_hostname_is_an_invalid_ping(hostname: str | bytes) -> None:
    data = ping_message(hostname)
    for cut in range(0, len(data) + 1, 7):
        codec = secured()
        error = violation(feed_reads(codec, [data[:cut], data[cut:]]))
        assert "client hostname" in error.reason
        assert msgpack.unpackb(error.reply) == ["PONG", False, "invalid ping message", "", ""]


@pytest.mark.parametrize(
    "hostname", ["", "h" * MAX_HOST_BYTES, "\u00e9" * (MAX_HOST_BYTES // 2), b"bin.example"]
)
def test_ping_client_hostname_within_the_rules_is_kept(hostname: str | bytes) -> None:
    codec = secured()
    (event,) = codec.receive_data(ping_message(hostname))
    assert isinstance(event, PingReceived)
    expected = hostname.decode() if isinstance(hostname, bytes) else hostname
    assert event.ping.client_hostname == expected


@pytest.mark.parametrize(
    "user", [b"user\xff", "u" * (MAX_USERNAME_BYTES + 1)], ids=["not-utf8", "too-long"]
)
def test_ping_with_a_bad_username_is_an_invalid_ping(user: str | bytes) -> None:
    error = refused(secured(AUTH), ping_message(user=user))
    assert "username" in error.reason
    assert msgpack.unpackb(error.reply)[:3] == ["PONG", False, "invalid ping message"]


def test_from_message_says_why_a_ping_is_invalid() -> None:
    with pytest.raises(InvalidPing, match="expected PING"):
        Ping.from_message(["PONG", "h", "s", "d", "u", "p"])
    with pytest.raises(InvalidPing, match="neither str nor bin"):
        Ping.from_message(["PING", 1, "s", "d", "u", "p"])
    with pytest.raises(InvalidPing, match="client hostname is not valid UTF-8"):
        Ping.from_message(["PING", b"\xff", "s", "d", "u", "p"])


def test_ping_over_max_ping_bytes_is_refused_whatever_max_request_bytes() -> None:
    data = msgpack.packb(["PING", "client.example", "s" * MAX_PING_BYTES, PING_VECTOR, "", ""])
    for piece in (1000, len(data)):
        limits = ForwardLimits(max_request_bytes=16 << 20)
        codec = ForwardServerConnection(limits, helo=Helo(NONCE))
        reads = [data[i : i + piece] for i in range(0, len(data), piece)]
        accepted = MAX_PING_BYTES // piece
        feed_reads(codec, reads[:accepted])
        assert codec.buffered_bytes == accepted * piece
        error = refused(codec, reads[accepted])
        assert f"PING exceeds {MAX_PING_BYTES} bytes" in error.reason
        assert msgpack.unpackb(error.reply)[:3] == ["PONG", False, "invalid ping message"]


def test_a_large_first_request_is_refused_after_max_ping_bytes() -> None:
    # Before: a 16 MiB first request was decoded whole (about 72x its size in
    # objects) before anything checked that it was a PING.
    data = request("x" * 100_000)
    reads = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    codec = secured()
    feed_reads(codec, reads[:4])
    assert codec.buffered_bytes == 4000
    violation(codec.receive_data(reads[4]), "PING exceeds")


@pytest.mark.parametrize("max_request_bytes", [1000, 16 << 20])
def test_ping_followed_in_the_same_read_by_too_much_is_a_clean_error(
    max_request_bytes: int,
) -> None:
    # Regression: a PING followed in one read by more than max_request_bytes
    # crashed the connection task (the PING was checked after the codec closed).
    limit = min(MAX_PING_BYTES, max_request_bytes)
    extra = request("c1") * (2 * limit // len(request("c1")) + 1)
    assert len(extra) > limit
    codec = ForwardServerConnection(
        ForwardLimits(max_request_bytes=max_request_bytes), helo=Helo(NONCE)
    )
    error = refused(codec, ping_bytes() + extra)
    assert f"more than {limit} bytes sent before the PONG" in error.reason
    assert msgpack.unpackb(error.reply)[:2] == ["PONG", False]
    with pytest.raises(LocalProtocolError):
        codec.receive_data(b"\xc0")


def test_bytes_held_while_authenticating_are_counted_and_bounded() -> None:
    held = request("c1") + request("c2")
    codec = secured()
    (event,) = codec.receive_data(ping_bytes() + held)
    assert isinstance(event, PingReceived)
    assert codec.state is ForwardState.AUTHENTICATING
    assert codec.buffered_bytes == len(held)
    # More bytes while the verdict is pending, up to the limit, are held too.
    more = b"\xc0" * (MAX_PING_BYTES - len(held))
    assert codec.receive_data(more) == []
    assert codec.buffered_bytes == MAX_PING_BYTES
    violation(codec.receive_data(b"\xc0"), "before the PONG")


def test_held_requests_get_the_full_request_limit_after_the_pong() -> None:
    codec = secured()
    codec.receive_data(ping_bytes() + request("c1"))
    verdict = codec.check_ping(shared_keys=[KEY], users_required=False, password=None)
    _, held = codec.finish_handshake(verdict, "server.example")
    assert [e.chunk.text() for e in held if isinstance(e, EventsReceived) and e.chunk] == ["c1"]
    assert codec.buffered_bytes == 0
    big = msgpack.packb(["tag", [[1700000000, {"pad": "x" * 10_000}]], {"chunk": "big"}])
    assert len(big) > MAX_PING_BYTES
    (event,) = codec.receive_data(big)
    assert isinstance(event, EventsReceived)


def test_requests_drained_by_the_verdict_leave_no_stale_size_hint() -> None:
    """A request held after the PING, and part of the next: the next read must count.

    The verdict drains what came after the PING; the codec's head of the
    unfinished request was kept before that, and must not be taken for the
    second request's (its declared size would say a read that completes
    the second request "completes nothing", and a large decode would run on
    the event loop: found by review).
    """
    # The first is PackedForward too, and larger: its size would be read for the second's.
    first = msgpack.packb(["tag", b"\x92\x01\x80" * 1000, {"chunk": "c1"}], use_bin_type=True)
    second = msgpack.packb(["tag", b"\x92\x01\x80" * 100, {"chunk": "c2"}], use_bin_type=True)
    assert len(ping_bytes() + first + second[:10]) < MAX_PING_BYTES
    codec = secured()
    codec.receive_data(ping_bytes() + first + second[:10])
    verdict = codec.check_ping(shared_keys=[KEY], users_required=False, password=None)
    _, held = codec.finish_handshake(verdict, "server.example")
    assert [e.chunk.text() for e in held if isinstance(e, EventsReceived) and e.chunk] == ["c1"]
    rest = second[10:]
    assert not codec.completes_nothing(rest)
    (event,) = codec.receive_data(rest)
    assert isinstance(event, EventsReceived)
    # Once a read starts the head again, the hint works as before.
    third = msgpack.packb(["tag", b"\x92\x01\x80" * 400, {"chunk": "c3"}], use_bin_type=True)
    codec.receive_data(third[:10])
    assert codec.completes_nothing(third[10:-11])  # the entries are not all in
    assert not codec.completes_nothing(third[10:])
