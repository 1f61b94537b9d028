"""Fixtures for the payload-store tests: a real local S3 server (moto) for the session."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

S3_BUCKET = "fleetserve-payloads"
S3_KEY_ID = "fleetserve-test-key"
S3_SECRET = "fleetserve-test-secret"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str = S3_BUCKET
    access_key_id: str = S3_KEY_ID
    secret_access_key: str = S3_SECRET


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 on a free loopback port, in a thread, with one bucket made."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        req = urllib.request.Request(f"{endpoint}/{S3_BUCKET}", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        yield S3Server(endpoint)
    finally:
        server.stop()
