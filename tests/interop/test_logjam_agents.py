"""The Logjam listener as today's agents see it: their reply checks, app-envs and topics.

:class:`AgentForwarder` is a pyzmq DEALER that does what skaes/logjam_agent's
``ZMQForwarder`` does at HEAD (commit 58ac43be7d74b2db4c35cafc24b25a29702bb0fe,
version 0.39.2, ``lib/logjam_agent/zmq_forwarder.rb``):

* a synchronous message is ``["", app_env, key, data, info]`` and a ping is
  ``send_receive("ping", @app_env, "{}", NO_COMPRESSION)``, so ``["", "ping",
  app_env, "{}", info]``;
* the routing key is ``"logs.#{app_env.sub('-','.')}"`` plus ``".#{engine}"``
  when an engine is given, unless the caller passes ``routing_key``;
* ``info`` is ``pack_info`` (``lib/logjam_agent/util.rb``): tag, compression,
  version 1, device 0, ``zclock_time``, sequence, big-endian; the sequence
  starts at ``SEQUENCE_START = 0`` and is incremented before each message;
* the answer is checked exactly as ``send_receive`` does: "unexpected answer
  from logjam broker" unless ``answer_parts.first == app_env`` and
  ``answer_parts.second.to_s.to_i`` is 200 or 202.

The Ruby agent itself cannot run here (no Ruby, and its ``ffi-rzmq`` gem is
on no registry this project installs from), so its check is reproduced, and
the frames are checked end to end against the listener and the real writer.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from appliance.protocols.logjam import Compression, pack_meta
from tests.appliance.server.test_logjam_listener import Harness, in_thread, logjam_service

pytestmark = pytest.mark.interop

#: ``VALID_RESPONSE_CODES`` of zmq_forwarder.rb.
VALID_RESPONSE_CODES = (200, 202)
#: Ruby's ``String#to_i``: optional leading whitespace and sign, then digits (else 0).
_RUBY_TO_I = re.compile(rb"\s*([+-]?\d+)")


def ruby_to_i(frame: bytes | None) -> int:
    """``frame.to_s.to_i`` in Ruby (``nil.to_s`` is ``""``, whose ``to_i`` is 0)."""
    match = _RUBY_TO_I.match(frame or b"")
    return int(match.group(1)) if match else 0


def unexpected_answer(app_env: str, answer: list[bytes]) -> bool:
    """True when zmq_forwarder.rb ``send_receive`` logs "unexpected answer from logjam broker"."""
    first = answer[0] if answer else None
    second = answer[1] if len(answer) > 1 else None
    return first != app_env.encode() or ruby_to_i(second) not in VALID_RESPONSE_CODES


class AgentForwarder:
    """``LogjamAgent::ZMQForwarder`` (sync mode and ping) with pyzmq: its frames, its checks."""

    def __init__(
        self,
        endpoint: str,
        app: str,
        env: str,
        *,
        server_key: str | None = None,
        keypair: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.app_env = f"{app}-{env}"
        self.sequence = 0  # SEQUENCE_START
        #: What the agent would hand to its error handler (``log_warning``).
        self.warnings: list[str] = []
        #: Every answer received, as frames.
        self.answers: list[list[bytes]] = []
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        # default_options of zmq_forwarder.rb
        sock.set(zmq.LINGER, 1000)
        sock.set(zmq.SNDHWM, 1000)
        sock.set(zmq.RCVHWM, 1000)
        sock.set(zmq.RCVTIMEO, 5000)
        sock.set(zmq.SNDTIMEO, 5000)
        if server_key is not None and keypair is not None:
            # What a CURVE-capable agent adds (the Ruby agent has no CURVE option).
            sock.curve_serverkey = server_key.encode()
            sock.curve_publickey, sock.curve_secretkey = keypair
        sock.connect(endpoint)
        self.sock = sock

    def forward(
        self,
        data: dict[str, Any],
        *,
        app_env: str | None = None,
        routing_key: str | None = None,
        engine: str | None = None,
    ) -> bytes | None:
        """``forward(data, sync: true, ...)``: the status frame, or None."""
        app_env = app_env or self.app_env
        key = routing_key or "logs." + app_env.replace("-", ".", 1)  # app_env.sub('-','.')
        if engine:
            key += f".{engine}"
        payload = json.dumps(data).encode()  # compression_method NO_COMPRESSION (the default)
        return self._send_receive(app_env, key, payload, Compression.NONE)

    def ping(self) -> None:
        if not self._send_receive("ping", self.app_env, b"{}", Compression.NONE):
            self.warnings.append("failed to receive pong")

    def _send_receive(self, app_env: str, key: str, data: bytes, compression: int) -> bytes | None:
        self.sequence += 1  # next_fixnum
        info = pack_meta(compression=compression, created_ms=int(time.time() * 1000),
                         sequence=self.sequence)  # fmt: skip
        self.sock.send_multipart([b"", app_env.encode(), key.encode(), data, info])
        try:
            answer = self.sock.recv_multipart()
        except zmq.Again:
            self.warnings.append("ZMQ error on receiving: Resource temporarily unavailable")
            return None
        self.answers.append(answer)
        if unexpected_answer(app_env, answer):
            self.warnings.append(f"unexpected answer from logjam broker: {answer!r}")
        return answer[1] if len(answer) > 1 else None

    def close(self) -> None:
        self.sock.close()


async def agent(service: Harness, app: str, env: str) -> AgentForwarder:
    """A forwarder for ``app``-``env``; with CURVE, under a new key ``agent-N``."""
    server_key = service.ports.server_public_key
    if server_key is None:
        return AgentForwarder(service.router, app, env)
    keypair = await service.add_key(f"agent-{len(service.keys) + 1}")
    return AgentForwarder(service.router, app, env, server_key=server_key, keypair=keypair)


# -- the check itself --------------------------------------------------------------------------


def test_the_agents_check_refuses_the_old_reply_form() -> None:
    """The form the appliance once sent made the current agent warn on every reply."""
    assert unexpected_answer("shop-production", [b"", b"202 Accepted"])
    assert unexpected_answer("ping", [b"", b"200 OK", b"logjam.example.com"])
    assert not unexpected_answer("shop-production", [b"shop-production", b"202 Accepted"])
    assert not unexpected_answer("ping", [b"ping", b"200 OK", b"logjam.example.com"])
    # A 400 is always reported, whatever the first frame.
    assert unexpected_answer("shop-production", [b"shop-production", b"400 Bad Request"])
    assert unexpected_answer("shop-production", [b"shop-production"])
    assert (ruby_to_i(b"202 Accepted"), ruby_to_i(b" 200 OK"), ruby_to_i(None)) == (202, 200, 0)


# -- against the listener ----------------------------------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
async def test_logjam_agent_gets_the_answers_it_checks_for(tmp_path: Path, curve: bool) -> None:
    async with logjam_service(tmp_path, curve=curve) as service:
        shop = await agent(service, "shop", "production")
        assert await in_thread(shop.forward, {"action": "Orders#show", "seq": 1}) == b"202 Accepted"
        await in_thread(shop.ping)
        assert (
            await in_thread(lambda: shop.forward({"seq": 2}, engine="sidekiq")) == b"202 Accepted"
        )
        shop.close()
    assert shop.warnings == []
    assert shop.answers == [
        [b"shop-production", b"202 Accepted"],
        [b"ping", b"200 OK", b"logjam.test.example"],
        [b"shop-production", b"202 Accepted"],
    ]
    rows = sorted(service.rows(), key=lambda row: json.loads(row["record"])["seq"])
    assert [row["tag"] for row in rows] == [
        "logs.shop.production", "logs.shop.production.sidekiq"
    ]  # fmt: skip


#: (app, env, routing key or None for the agent's own, engine): app-envs and
#: topics that logjam-tools' device accepts (src/logjam-util.c at HEAD
#: 994b6f518fbb829fa4a6ada930a5334210a517e5, well_formed_stream_name and
#: well_formed_topic) and the appliance once answered 400.
DEVICE_ACCEPTS = [
    ("my.app", "production", None, None),  # logs.my.app.production
    ("3scale", "production", None, None),  # logs.3scale.production
    ("my-app", "production", None, None),  # logs.my.app-production
    ("x", "worker", "logs.x.worker:1", None),
    ("shop", "production", "frontend.page.shop", None),
    ("shop", "production", "frontend.ajax.shop.production", None),
    ("shop", "production", None, "worker:1"),  # logs.shop.production.worker:1
    ("shop", "production", "events.shop.production.deploy", None),
    ("shop", "production", "javascript.shop.production", None),
    ("shop", "production", "mobile.ios", None),
]


@pytest.mark.trio
async def test_app_envs_and_topics_the_device_accepts_are_stored(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, curve=True) as service:
        expected: list[tuple[str, str]] = []
        for seq, (app, env, routing_key, engine) in enumerate(DEVICE_ACCEPTS, start=1):
            forwarder = await agent(service, app, env)
            status = await in_thread(
                lambda f=forwarder, s=seq, r=routing_key, e=engine: f.forward(
                    {"seq": s}, routing_key=r, engine=e
                )
            )
            assert status == b"202 Accepted", (app, env, routing_key, forwarder.answers)
            assert forwarder.warnings == [], forwarder.warnings
            assert forwarder.answers == [[forwarder.app_env.encode(), b"202 Accepted"]]
            key = routing_key or "logs." + forwarder.app_env.replace("-", ".", 1)
            expected.append((forwarder.app_env, key + (f".{engine}" if engine else "")))
            forwarder.close()
    rows = sorted(service.rows(), key=lambda row: json.loads(row["record"])["seq"])
    got = [(json.loads(row["record"])["_logjam"]["app_env"], row["tag"]) for row in rows]
    assert got == expected
    assert [row["source"] for row in rows] == [f"agent-{n}" for n in range(1, len(rows) + 1)]
    assert ("3scale-production", "logs.3scale.production") in got
    assert ("x-worker", "logs.x.worker:1") in got


@pytest.mark.trio
async def test_a_refused_message_is_answered_with_its_app_env_and_400(tmp_path: Path) -> None:
    async with logjam_service(tmp_path, curve=False) as service:
        shop = await agent(service, "shop", "production")
        # Not a topic of the device's (nor of the spec's): 400, nothing stored.
        status = await in_thread(lambda: shop.forward({"seq": 1}, routing_key="metrics.shop"))
        assert status == b"400 Bad Request"
        # An app-env the device refuses (no "-") is echoed back as sent.
        status = await in_thread(lambda: shop.forward({"seq": 2}, app_env="shopproduction"))
        assert status == b"400 Bad Request"
        shop.close()
    assert shop.answers == [
        [b"shop-production", b"400 Bad Request"],
        [b"shopproduction", b"400 Bad Request"],
    ]
    # The agent reports a 400 (its status check), not a malformed answer.
    assert len(shop.warnings) == 2
    assert service.rows() == []
