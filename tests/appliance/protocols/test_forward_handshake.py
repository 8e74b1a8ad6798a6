"""The forward handshake's digests, PING parsing and verdicts (DESIGN §4 vectors)."""

from __future__ import annotations

import msgpack
import pytest

from appliance.protocols.errors import RemoteProtocolError
from appliance.protocols.forward import (
    EventsReceived,
    ForwardLimits,
    ForwardServerConnection,
    ForwardState,
    PingReceived,
)
from appliance.protocols.forward_handshake import (
    REASON_SHARED_KEY,
    REASON_USER,
    Helo,
    Ping,
    password_digest,
    ping_digest,
    pong_bytes,
    verify_ping,
)

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
        events = codec.receive_data(stream[:cut]) + codec.receive_data(stream[cut:])
        assert [type(e) for e in events] == [PingReceived]
        assert codec.state is ForwardState.AUTHENTICATING
        verdict = codec.check_ping(shared_keys=[KEY], users_required=False, password=None)
        pong, held = codec.finish_handshake(verdict, "server.example")
        assert msgpack.unpackb(pong)[:2] == ["PONG", True]
        assert [e.chunk.text() for e in held if isinstance(e, EventsReceived)] == ["c1"]
        assert codec.state is ForwardState.TRANSPORT_MSGPACK


def test_events_before_ping_are_refused_with_pong_false() -> None:
    codec = secured()
    with pytest.raises(RemoteProtocolError) as excinfo:
        codec.receive_data(request("early"))
    assert msgpack.unpackb(excinfo.value.reply) == ["PONG", False, "invalid ping message", "", ""]
    assert codec.state is ForwardState.CLOSED


def test_json_form_is_refused_when_the_handshake_is_on() -> None:
    codec = secured()
    with pytest.raises(RemoteProtocolError):
        codec.receive_data(b'["tag", 1700000000, {"a": 1}]')


def test_failed_verdict_closes_with_the_reason() -> None:
    codec = secured(AUTH)
    codec.receive_data(ping_bytes(user="tagomoris", password="0" * 128))
    verdict = codec.check_ping(shared_keys=[KEY], users_required=True, password=b"fluentd")
    with pytest.raises(RemoteProtocolError) as excinfo:
        codec.finish_handshake(verdict, "server.example")
    assert msgpack.unpackb(excinfo.value.reply) == [
        "PONG", False, "username/password mismatch", "", "",
    ]  # fmt: skip
    assert codec.state is ForwardState.CLOSED


def test_held_bytes_are_bounded_while_authenticating() -> None:
    codec = ForwardServerConnection(ForwardLimits(max_request_bytes=1000), helo=Helo(NONCE))
    codec.receive_data(ping_bytes())
    with pytest.raises(RemoteProtocolError, match="max_request_bytes"):
        codec.receive_data(b"\x90" * 2000)
