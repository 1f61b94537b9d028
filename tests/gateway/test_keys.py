"""API keys, tenants and scopes: the key ring (fails closed), the gateway's use of it,
``fleetserve keys add``, and a real server with a keys file."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import fleetserve
from fleetserve.catalog import Catalog
from fleetserve.cli_keys import add_key
from fleetserve.gateway import Gateway
from fleetserve.gateway.auth import (
    Authenticator,
    KeyEntry,
    hash_key,
    new_key,
    parse_keys,
    read_keys_file,
    require,
)
from fleetserve.gateway.wiring import Hooks, Routes
from fleetserve.gateway_setup import build_dashboard
from fleetserve.metrics import Metrics
from fleetserve.settings import Settings
from fleetserve.wire import (
    OPEN,
    Envelope,
    Forbidden,
    InvalidInput,
    Overloaded,
    Principal,
    Scope,
    Unauthorized,
)

from ..conftest import TINY, ServerThread, tiny_settings

INFER_KEY = "fs-infer-key-for-tests"
ADMIN_KEY = "fs-admin-key-for-tests"
WRITE_KEY = "fs-adapters-only-key-for-tests"


def entry(key: str, tenant: str = "acme", scopes: str = "[infer]", name: str = "") -> str:
    label = f"\n  name: {name}" if name else ""
    return f"- sha256: {hash_key(key)}\n  tenant: {tenant}\n  scopes: {scopes}{label}\n"


RING = (
    entry(INFER_KEY, "acme", "[infer]", "acme-app")
    + entry(ADMIN_KEY, "ops", "[admin]")
    + entry(WRITE_KEY, "acme", "[adapters:write]")
)


def settings(**overrides: Any) -> Settings:
    return Settings.load(overrides=overrides)


def ring(tmp_path: Path, text: str = RING, **overrides: Any) -> Authenticator:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return Authenticator.from_settings(settings(keys_file=str(path), **overrides))


def http_scope(path: str = "/v1/models", method: str = "GET", **headers: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
    }


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# -- the key ring -----------------------------------------------------------------------


def test_open_by_default_and_x_tenant_picks_the_tenant() -> None:
    auth = Authenticator.from_settings(settings())
    assert auth.is_open
    assert auth.authenticate(http_scope()) is OPEN
    # open ignores Authorization: OpenAI clients send a placeholder key
    assert auth.authenticate(http_scope(authorization="Bearer unused")) is OPEN
    p = auth.authenticate(http_scope(x_tenant="team-a"))
    assert p == Principal("team-a", frozenset(Scope)) and p.can(Scope.ADMIN)
    with pytest.raises(InvalidInput) as err:
        auth.authenticate(http_scope(x_tenant="Not A Tenant"))
    assert err.value.field == "x-tenant"


def test_auth_open_ignores_configured_keys(tmp_path: Path) -> None:
    auth = ring(tmp_path, auth="open")
    assert auth.is_open and auth.authenticate(http_scope()) is OPEN


def test_keys_file_authenticates_by_hash_and_ignores_x_tenant(tmp_path: Path) -> None:
    auth = ring(tmp_path)
    assert not auth.is_open and "3 API key(s)" in auth.describe()
    p = auth.authenticate(http_scope(x_tenant="ops", **bearer(INFER_KEY)))
    assert p == Principal("acme", frozenset({Scope.INFER}))  # the key's tenant, not X-Tenant
    assert auth.authenticate(http_scope(authorization=f"bearer  {ADMIN_KEY} ")).tenant == "ops"
    for headers in ({}, bearer("fs-nope"), {"authorization": INFER_KEY}, bearer("")):
        with pytest.raises(Unauthorized) as err:
            auth.authenticate(http_scope(**headers))
        assert err.value.field == "authorization"
        assert err.value.to_body() == {
            "error": {
                "code": "unauthorized",
                "message": "missing or wrong API key (Authorization: Bearer <key>)",
                "field": "authorization",
            }
        }
    with pytest.raises(Unauthorized):  # a hash is not a key
        auth.authenticate(http_scope(**bearer(hash_key(INFER_KEY))))


def test_require_names_the_missing_scope_and_admin_has_all(tmp_path: Path) -> None:
    auth = ring(tmp_path)
    writer = auth.authenticate(http_scope(**bearer(WRITE_KEY)))
    require(writer, Scope.ADAPTERS_WRITE)
    with pytest.raises(Forbidden) as err:
        require(writer, Scope.INFER)
    assert "'infer'" in err.value.message and err.value.field == "authorization"
    admin = auth.authorize(http_scope(**bearer(ADMIN_KEY)), Scope.ADMIN)
    for scope in Scope:
        require(admin, scope)
    with pytest.raises(Forbidden, match="'admin'"):
        auth.authorize(http_scope(**bearer(INFER_KEY)), Scope.ADMIN)


def test_the_ring_is_frozen(tmp_path: Path) -> None:
    auth = ring(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        auth.keys = None  # type: ignore[misc]
    assert auth.keys is not None
    with pytest.raises(TypeError):
        auth.keys[hash_key("fs-mine")] = OPEN  # type: ignore[index]


def test_keys_as_a_mapping_inline_json_and_combined(tmp_path: Path) -> None:
    mapping = "# comment\nkeys:\n" + "".join("  " + ln + "\n" for ln in RING.splitlines())
    assert len(ring(tmp_path, mapping).keys or {}) == 3
    inline = json.dumps([{"sha256": hash_key("fs-k"), "tenant": "b", "scopes": ["infer"]}])
    auth = Authenticator.from_settings(settings(keys=inline, auth="keys"))
    assert auth.authenticate(http_scope(**bearer("fs-k"))).tenant == "b"
    both = ring(tmp_path, keys=inline)
    assert len(both.keys or {}) == 4 and "keys setting" in both.source
    with pytest.raises(ValueError, match="same sha256"):
        ring(tmp_path, keys=entry(INFER_KEY, "other"))


def test_legacy_api_key_is_the_default_tenant_with_every_scope() -> None:
    for mode in ("auto", "keys"):
        auth = Authenticator.from_settings(settings(api_key="s3cret", auth=mode))
        assert auth.authenticate(http_scope(**bearer("s3cret"))) == Principal(
            "default", frozenset(Scope)
        )
        with pytest.raises(Unauthorized):
            auth.authenticate(http_scope(**bearer("s3cre")))


def test_keys_take_precedence_over_the_api_key(tmp_path: Path) -> None:
    auth = ring(tmp_path, api_key="s3cret")
    with pytest.raises(Unauthorized):
        auth.authenticate(http_scope(**bearer("s3cret")))


def test_an_empty_keys_file_refuses_everything_and_auth_keys_refuses_to_start(
    tmp_path: Path,
) -> None:
    auth = ring(tmp_path, "")
    assert not auth.is_open
    with pytest.raises(Unauthorized):
        auth.authenticate(http_scope())
    with pytest.raises(ValueError, match="holds no keys"):
        ring(tmp_path, "", auth="keys")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"auth": "bogus"}, "auth must be one of auto, keys, open, not 'bogus'"),
        ({"auth": ""}, "auth must be one of"),
        ({"auth": "keys"}, "auth=keys but no API keys are configured"),
        ({"keys_file": "/nonexistent/keys.yaml"}, "keys file /nonexistent/keys.yaml does not"),
    ],
)
def test_refuses_to_start(overrides: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Authenticator.from_settings(settings(**overrides))


H = hash_key("fs-x")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[{", "not valid YAML"),
        ("just a string", "must be a list"),
        ("other: 1\n", "unknown top-level field"),
        ("keys: 5\n", "must be a list"),
        ("- 5\n", "key 1: must be a mapping"),
        ("- {tenant: a, scopes: [infer]}\n", "key 1: missing sha256"),
        (f"- {{sha256: {H}, scopes: [infer]}}\n", "missing tenant"),
        (f"- {{sha256: {H}, tenant: a}}\n", "missing scopes"),
        ("- {sha256: abc123, tenant: a, scopes: [infer]}\n", "64 hex digits"),
        (f"- {{sha256: {H}, tenant: a, scopes: [infer, fly]}}\n", "unknown scope 'fly'"),
        (f"- {{sha256: {H}, tenant: a, scopes: []}}\n", "no scopes"),
        (f"- {{sha256: {H}, tenant: a, scopes: 7}}\n", "scopes must be a list"),
        (f"- {{sha256: {H}, tenant: Acme, scopes: [infer]}}\n", "bad tenant name 'Acme'"),
        (f"- {{sha256: {H}, tenant: a/b, scopes: [infer]}}\n", "bad tenant name"),
        (f"- {{sha256: {H}, tenant: a, scopes: [infer], name: 3}}\n", "name must be a string"),
        (entry("fs-x", name="one") + entry("fs-x", "b"), "key 2 has the same sha256 as key 1"),
    ],
)
def test_malformed_keys_files_refuse_to_start(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        ring(tmp_path, text)
    assert str(tmp_path / "keys.yaml") in str(err.value)


def test_a_plaintext_key_is_refused_and_never_repeated(tmp_path: Path) -> None:
    secret = "fs-PlainTextSecret0123456789"
    for text in (
        f"- {{sha256: {secret}, tenant: a, scopes: [infer]}}\n",
        f"- {{key: {secret}, tenant: a, scopes: [infer]}}\n",
        f"- {{sha256: {H}, tenant: a, scopes: [infer], secret: {secret}}}\n",
        f"[{{sha256: {secret}, tenant: a, scopes: [infer],\n",  # broken YAML
    ):
        with pytest.raises(ValueError) as err:
            ring(tmp_path, text)
        assert secret not in str(err.value), str(err.value)
        with pytest.raises(ValueError) as err:
            Authenticator.from_settings(settings(keys=text))
        assert secret not in str(err.value) and "FLEETSERVE_KEYS" in str(err.value)


def test_settings_repr_redacts_keys_and_api_key() -> None:
    s = settings(keys=RING, api_key="s3cret")
    assert hash_key(INFER_KEY) not in repr(s) and "s3cret" not in repr(s)
    assert "keys='***'" in repr(s)


def test_a_gateway_with_a_bad_auth_setting_does_not_build(tmp_path: Path) -> None:
    for bad in (settings(auth="keys"), settings(auth="nope", tune_dir=str(tmp_path))):
        with pytest.raises(ValueError):
            Gateway(bad, Catalog(), RecordingQueue(), Metrics(), hooks=Hooks(ready=lambda: True))


# -- fleetserve keys add ----------------------------------------------------------------


def test_add_key_stores_only_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "keys.yaml"
    entry_, key = add_key(path, tenant="acme", scopes="infer,adapters:write", name="ci")
    assert key.startswith("fs-") and len(key) > 40 and key != new_key()
    text = path.read_text()
    assert key not in text and key[3:] not in text and hash_key(key) in text
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_keys_file(path) == [entry_]
    assert entry_ == KeyEntry(
        hash_key(key), "acme", frozenset({Scope.INFER, Scope.ADAPTERS_WRITE}), "ci"
    )
    _, key2 = add_key(path, tenant="ops", scopes="admin")
    auth = Authenticator.from_settings(settings(keys_file=str(path)))
    assert auth.authenticate(http_scope(**bearer(key))).tenant == "acme"
    assert auth.authenticate(http_scope(**bearer(key2))).can(Scope.ADMIN)


def test_add_key_keeps_comments_and_the_mapping_form(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("# our keys\n" + entry("fs-old"))
    add_key(path, tenant="b", scopes="infer")
    assert path.read_text().startswith("# our keys\n") and len(read_keys_file(path)) == 2
    path.write_text("keys:\n" + "".join("  " + ln + "\n" for ln in entry("fs-old").splitlines()))
    _, key = add_key(path, tenant="b", scopes="infer")
    assert [e.tenant for e in read_keys_file(path)] == ["acme", "b"]
    assert "keys:" in path.read_text() and key not in path.read_text()
    path.write_text(f"[{{sha256: {hash_key('fs-old')}, tenant: a, scopes: [infer]}}]\n")
    _, key = add_key(path, tenant="b", scopes="infer")  # flow style: rewritten as a list
    assert [e.tenant for e in read_keys_file(path)] == ["a", "b"]


def test_add_key_refuses_bad_input_and_leaves_a_broken_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    with pytest.raises(ValueError, match="bad tenant"):
        add_key(path, tenant="No", scopes="infer")
    with pytest.raises(ValueError, match="unknown scope 'write'"):
        add_key(path, tenant="a", scopes="infer,write")
    assert not path.exists()
    path.write_text("- oops\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        add_key(path, tenant="a", scopes="infer")
    assert path.read_text() == "- oops\n"


def fleetserve_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetserve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.slow
def test_cli_keys_add_prints_the_key_once(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    out = fleetserve_cli(
        "keys", "add", "--tenant", "acme", "--scopes", "infer", "--file", str(path)
    )
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert key.startswith("fs-") and "\n" not in key
    assert "not stored" in out.stderr and key not in out.stderr
    assert key not in path.read_text() and hash_key(key) in path.read_text()
    listed = fleetserve_cli("keys", "list", "--file", str(path))
    assert (
        listed.returncode == 0 and hash_key(key)[:12] in listed.stdout and key not in listed.stdout
    )
    for bad in (
        ["keys", "add", "--tenant", "acme"],  # no keys file
        ["keys", "add", "--scopes", "infer", "--file", str(path)],  # no tenant
        ["keys", "add", "--tenant", "acme", "--scopes", "fly", "--file", str(path)],
    ):
        out = fleetserve_cli(*bad)
        assert out.returncode == 1 and out.stderr.startswith("error: "), out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_serve_with_a_bad_auth_setting_is_one_line(tmp_path: Path, tiny_catalog: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("- {sha256: 12, tenant: a, scopes: [infer]}\n")
    cases = [
        (["--auth", "bogus"], "auth must be one of"),
        (["--auth", "keys"], "auth=keys but no API keys"),
        (["--keys-file", str(path)], "sha256 must be 64 hex digits"),
    ]
    for args, message in cases:
        out = fleetserve_cli(
            "serve", "--port", "0", "--models", TINY, "--catalog", str(tiny_catalog), *args
        )
        assert out.returncode == 1, out.stderr
        assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
        assert out.stderr.startswith("error: ") and message in out.stderr, out.stderr


# -- the gateway, as plain ASGI ---------------------------------------------------------


class RecordingQueue:
    """A queue that records what is published and answers 429 (no worker needed)."""

    healthy = True

    def __init__(self) -> None:
        self.published: list[Envelope] = []

    async def publish(self, env: Envelope, body: bytes) -> Any:
        self.published.append(env)
        raise Overloaded("recorded", retry_after=1.0)


class AdaptersApp:
    """A stand-in for the adapters API: records the principal it was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Principal]] = []

    async def __call__(
        self, scope: MutableMapping[str, Any], receive: Any, send: Any, principal: Principal
    ) -> None:
        self.calls.append((scope["method"], scope["path"], principal))
        require(principal, Scope.ADAPTERS_WRITE)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(
    app: Gateway, path: str, method: str = "GET", body: bytes = b"", **headers: str
) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    scope = http_scope(path, method, **headers)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(dict(msg))

    await app(scope, receive, send)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(payload) if payload[:1] == b"{" else {}


@pytest.fixture
def catalog(tiny_catalog: Path) -> Catalog:
    return Catalog.load([tiny_catalog], bundled=False)


def gateway(
    tmp_path: Path, catalog: Catalog, auth: Authenticator, adapters: AdaptersApp | None = None
) -> tuple[Gateway, RecordingQueue]:
    queue = RecordingQueue()
    s = settings(tune_dir=str(tmp_path / "tune"))
    app = Gateway(
        s,
        catalog,
        queue,  # type: ignore[arg-type]
        Metrics(),
        hooks=Hooks(ready=lambda: True),
        routes=Routes(adapters=adapters),
        dashboard=build_dashboard(s, auth),
        authenticator=auth,
    )
    return app, queue


ENCODE = f"/v1/encode/{TINY}"
BODY = b'{"inputs": ["x"]}'
JSON = {"content_type": "application/json"}


async def test_the_envelope_carries_the_principals_tenant(tmp_path: Path, catalog: Catalog) -> None:
    app, queue = gateway(tmp_path, catalog, ring(tmp_path))
    status, _ = await call(app, ENCODE, "POST", BODY, x_tenant="ops", **JSON, **bearer(INFER_KEY))
    assert status == 429 and queue.published[-1].tenant == "acme"
    app, queue = gateway(tmp_path, catalog, Authenticator.open())
    assert (await call(app, ENCODE, "POST", BODY, x_tenant="team-b", **JSON))[0] == 429
    assert (await call(app, ENCODE, "POST", BODY, **JSON))[0] == 429
    assert [e.tenant for e in queue.published] == ["team-b", "default"]
    status, err = await call(app, ENCODE, "POST", BODY, x_tenant="Team B", **JSON)
    assert status == 400 and err["error"]["field"] == "x-tenant" and len(queue.published) == 2


async def test_routes_and_scopes(tmp_path: Path, catalog: Catalog) -> None:
    adapters = AdaptersApp()
    app, queue = gateway(tmp_path, catalog, ring(tmp_path), adapters)
    status, err = await call(app, ENCODE, "POST", BODY, **JSON, **bearer(WRITE_KEY))
    assert (
        status == 403 and err["error"]["code"] == "forbidden" and "infer" in err["error"]["message"]
    )
    assert not queue.published
    assert (await call(app, "/v1/models", **bearer(WRITE_KEY)))[0] == 200  # any valid key
    assert (await call(app, "/v1/models"))[0] == 401
    for path in ("/healthz", "/readyz"):  # probes stay open
        assert (await call(app, path))[0] == 200, path
    # the adapters API gets the principal after authentication, and checks scopes itself
    assert (await call(app, "/v1/adapters", "POST"))[0] == 401
    assert (await call(app, "/v1/adapters/acme/x", "DELETE", **bearer(WRITE_KEY)))[0] == 204
    assert (await call(app, "/v1/adapters", **bearer(INFER_KEY)))[0] == 403
    assert (await call(app, "/v1/adaptersx", **bearer(INFER_KEY)))[0] == 404
    assert [(m, p, pr.tenant) for m, p, pr in adapters.calls] == [
        ("DELETE", "/v1/adapters/acme/x", "acme"),
        ("GET", "/v1/adapters", "acme"),
    ]
    bare, _ = gateway(tmp_path, catalog, ring(tmp_path))  # no adapters API: 404 as before
    assert (await call(bare, "/v1/adapters", **bearer(INFER_KEY)))[0] == 404
    assert (await call(bare, "/v1/adapters"))[0] == 401


async def test_metrics_and_the_openapi_document_follow_the_auth_mode(
    tmp_path: Path, catalog: Catalog
) -> None:
    """With keys, /metrics needs the metrics scope (or admin) and /openapi.json any
    valid key; both answered anyone before. Open, both stay open."""
    scraper = "fs-prometheus-key-for-tests"
    app, _ = gateway(tmp_path, catalog, ring(tmp_path, RING + entry(scraper, "ops", "[metrics]")))
    status, err = await call(app, "/metrics")
    assert status == 401 and err["error"]["field"] == "authorization"
    status, err = await call(app, "/metrics", **bearer(INFER_KEY))
    assert status == 403 and "'metrics'" in err["error"]["message"]
    for key in (scraper, ADMIN_KEY):
        assert (await call(app, "/metrics", **bearer(key)))[0] == 200, key
    assert (await call(app, "/openapi.json"))[0] == 401
    for key in (INFER_KEY, WRITE_KEY, scraper):
        assert (await call(app, "/openapi.json", **bearer(key)))[0] == 200, key
    assert (await call(app, "/v1/models", **bearer(scraper)))[0] == 200  # any valid key
    status, _ = await call(app, ENCODE, "POST", BODY, **JSON, **bearer(scraper))
    assert status == 403  # a scraper's key calls no model
    open_app, _ = gateway(tmp_path, catalog, Authenticator.open())
    for path in ("/metrics", "/openapi.json"):
        assert (await call(open_app, path))[0] == 200, path


async def test_the_dashboard_needs_admin(tmp_path: Path, catalog: Catalog) -> None:
    app, _ = gateway(tmp_path, catalog, ring(tmp_path))
    for path in ("/v1/tuning/runs", "/dashboard/events"):
        assert (await call(app, path))[0] == 401, path
        status, err = await call(app, path, **bearer(INFER_KEY))
        assert status == 403 and "'admin'" in err["error"]["message"], path
    assert (await call(app, "/v1/tuning/runs", **bearer(ADMIN_KEY)))[0] == 200
    assert (await call(app, "/dashboard"))[0] == 200  # the page holds no data
    app, _ = gateway(tmp_path, catalog, Authenticator.open())
    assert (await call(app, "/v1/tuning/runs"))[0] == 200


# -- a real server with a keys file -----------------------------------------------------


@pytest.fixture(scope="module")
def cli_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A keys file with the three test keys, then one added by `fleetserve keys add`."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(RING)
    out = fleetserve_cli("keys", "add", "--tenant", "cli", "--scopes", "infer", "--file", str(path))
    assert out.returncode == 0, out.stderr
    return path, out.stdout.strip()


@pytest.fixture(scope="module")
def keys_server(
    tiny_catalog: Path, cli_key: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    tune = tmp_path_factory.mktemp("tune")
    s = tiny_settings(tiny_catalog, keys_file=str(cli_key[0]), auth="keys", tune_dir=str(tune))
    srv = ServerThread(s).start()
    yield srv
    srv.stop()


def test_server_refuses_without_a_valid_key(keys_server: ServerThread) -> None:
    url = keys_server.url + ENCODE
    for headers in ({}, bearer("fs-unknown"), {"authorization": f"Basic {INFER_KEY}"}):
        r = httpx.post(url, json={"inputs": ["x"]}, headers=headers)
        assert r.status_code == 401
        assert r.json() == {
            "error": {
                "code": "unauthorized",
                "message": "missing or wrong API key (Authorization: Bearer <key>)",
                "field": "authorization",
            }
        }
    r = httpx.post(url, json={"inputs": ["x"]}, headers=bearer(WRITE_KEY))
    assert r.status_code == 403
    assert set(r.json()["error"]) == {"code", "message", "field"}
    assert r.json()["error"]["code"] == "forbidden" and "'infer'" in r.json()["error"]["message"]
    assert httpx.get(keys_server.url + "/v1/models").status_code == 401
    assert httpx.get(keys_server.url + "/healthz").status_code == 200
    assert httpx.get(keys_server.url + "/readyz").status_code == 200
    assert httpx.get(keys_server.url + "/metrics").status_code == 401
    assert httpx.get(keys_server.url + "/openapi.json").status_code == 401
    scraped = httpx.get(keys_server.url + "/metrics", headers=bearer(ADMIN_KEY))
    assert scraped.status_code == 200 and "fleetserve_" in scraped.text


def test_server_serves_a_valid_key_under_its_tenant(
    keys_server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert keys_server.server is not None
    queue = keys_server.server.queue
    tenants: list[str] = []
    publish = queue.publish

    async def spy(env: Envelope, body: bytes) -> Any:
        tenants.append(env.tenant)
        return await publish(env, body)

    monkeypatch.setattr(queue, "publish", spy)
    headers = {**bearer(INFER_KEY), "x-tenant": "ops"}
    r = httpx.post(keys_server.url + ENCODE, json={"inputs": ["x"]}, headers=headers)
    assert r.status_code == 200, r.text
    assert len(r.json()["embeddings"][0]) == 32
    assert tenants == ["acme"]  # the key's tenant: X-Tenant is ignored
    models = httpx.get(keys_server.url + "/v1/models", headers=bearer(WRITE_KEY))
    assert models.status_code == 200 and models.json()["data"][0]["id"] == TINY


def test_the_sdk_sends_the_key(keys_server: ServerThread) -> None:
    with fleetserve.Client(keys_server.url, api_key=INFER_KEY) as c:
        assert c.encode(TINY, ["fox"]).shape == (1, 32)
    with (
        fleetserve.Client(keys_server.url, api_key="fs-wrong") as c,
        pytest.raises(fleetserve.Unauthorized),
    ):
        c.encode(TINY, ["fox"])
    with (
        fleetserve.Client(keys_server.url, api_key=WRITE_KEY) as c,
        pytest.raises(fleetserve.Forbidden),
    ):
        c.encode(TINY, ["fox"])


def test_the_key_keys_add_printed_authenticates(
    keys_server: ServerThread, cli_key: tuple[Path, str]
) -> None:
    path, key = cli_key
    text = path.read_text()
    for plain in (key, INFER_KEY, ADMIN_KEY, WRITE_KEY):
        assert plain not in text
    assert parse_keys(text, "file")[-1].tenant == "cli"
    with fleetserve.Client(keys_server.url, api_key=key) as c:
        assert c.encode(TINY, ["fox"]).shape == (1, 32)


def test_server_dashboard_data_needs_admin(keys_server: ServerThread) -> None:
    url = keys_server.url + "/v1/tuning/runs"
    assert httpx.get(url, headers=bearer(INFER_KEY)).status_code == 403
    assert httpx.get(url, headers=bearer(ADMIN_KEY)).status_code == 200


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_keys_example_runs_as_shown(tiny_catalog: Path, tmp_path: Path) -> None:
    """The block under "API keys and tenants": keys add, serve with the file, curl."""
    section = README.read_text().split("## API keys and tenants", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.replace("\\\n", "").splitlines() if not ln.startswith("#")]
    add, serve, curl = lines
    assert add.startswith("KEY=$(.venv/bin/fleetserve keys add ")
    assert serve.startswith(".venv/bin/fleetserve serve ")
    exe = str(Path(sys.executable).parent / "fleetserve")
    made = subprocess.run(
        ["bash", "-c", add.replace(".venv/bin/fleetserve ", exe + " ", 1) + ' && echo "$KEY"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    flags = serve.split()[2:]
    assert flags == ["--keys-file", "keys.yaml", "--auth", "keys"]
    keys_file = str(tmp_path / "keys.yaml")
    srv = ServerThread(tiny_settings(tiny_catalog, keys_file=keys_file, auth="keys")).start()
    try:
        cmd = curl.replace("localhost:8080", srv.url).replace(
            "sentence-transformers/all-MiniLM-L6-v2", TINY
        )
        out = subprocess.run(
            ["bash", "-c", cmd],
            env={"KEY": key, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert len(json.loads(out.stdout)["embeddings"][0]) == 32, out
        denied = subprocess.run(
            ["bash", "-c", cmd],
            env={"KEY": "fs-wrong", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(denied.stdout)["error"]["code"] == "unauthorized"
    finally:
        srv.stop()
