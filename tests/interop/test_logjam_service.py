"""Logjam through the real ``appliance serve``: CURVE keys from the CLI, a pyzmq DEALER."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from appliance.protocols.logjam import Compression, pack_meta
from tests.support.cli import run_cli

pytestmark = pytest.mark.interop


def test_dealer_with_a_cli_issued_curve_key_gets_202_and_a_row(appliance, tmp_path: Path) -> None:
    app = appliance({"logjam": 'protocol = "logjam"\ntls = false\npull_bind = "127.0.0.1:0"'})
    config = tmp_path / "appliance0.toml"
    server_key = run_cli("curve", "server-key", config=config, check=True).stdout.strip().encode()
    public, secret = zmq.curve_keypair()
    # "--" before the key: a Z85 key may begin with "-".
    run_cli("curve", "add", "--", "shop-web", public.decode(), config=config, check=True)

    context = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.curve_serverkey = server_key
    dealer.curve_publickey = public
    dealer.curve_secretkey = secret
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{app.ports['logjam']}")
    try:
        body = json.dumps({"action": "Home#index", "total_time": 12.5, "code": 200}).encode()
        meta = pack_meta(
            compression=Compression.NONE, sequence=1, created_ms=int(time.time() * 1000)
        )
        dealer.send_multipart([b"", b"shop-production", b"logs.shop", body, meta])
        # The spec's reply-msg: the app-env, then the status (no empty frame).
        assert dealer.recv_multipart() == [b"shop-production", b"202 Accepted"]
    finally:
        dealer.close()
    rows = app.rows()
    assert len(rows) == 1
    assert rows[0]["protocol"] == "logjam"
    assert rows[0]["tag"] == "logs.shop"
    assert rows[0]["source"] == "shop-web"
    assert json.loads(rows[0]["record"])["action"] == "Home#index"
