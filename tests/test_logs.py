"""One log style: text and JSON lines, access lines for every request (errors too),
timing headers on errors, secrets never logged, library progress bars off."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetserve.gateway.auth import new_key
from fleetserve.logs import CHILD_ENV, Redactor, child_env, kv, setup_logging
from fleetserve.logs.access import request_id
from fleetserve.logs.summary import ready_summary
from fleetserve.settings import Settings

from .conftest import TINY, ServerThread, tiny_settings

SECRET_KEY = "sk-live-0123456789abcdef"
S3_SECRET = "s3cr3t-Wd1f9XkQ"
NATS_PASS = "natspw-7781"


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """Our handler on a buffer for the test; the root logger as it was afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    out = io.StringIO()
    yield out
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    logging.captureWarnings(False)


def _secret_settings(**more: Any) -> Settings:
    return Settings.load(
        overrides={
            "api_key": SECRET_KEY,
            "s3_secret_access_key": S3_SECRET,
            "nats": f"nats://fleet:{NATS_PASS}@127.0.0.1:4222",
            **more,
        }
    )


def test_a_text_line_has_time_level_logger_message_and_fields(logs: io.StringIO) -> None:
    setup_logging(Settings(), stream=logs)
    log = logging.getLogger("fleetserve.gateway.app")
    log.info("loaded %s", "m", extra=kv(ms=12.5, note="two words\nforged INFO line"))
    line = logs.getvalue().rstrip("\n")
    assert "\n" not in line  # a value with a newline is quoted, never a second line
    time_, level, rest = line.split(None, 2)
    assert len(time_) == 8 and time_.count(":") == 2 and level == "INFO"
    assert rest.startswith("gateway: loaded m ms=12.5 note=") and '"two words\\n' in rest


def test_json_lines_parse_and_carry_the_fields(logs: io.StringIO) -> None:
    setup_logging(Settings(log_format="json", log_level="debug"), stream=logs, tag="worker-0")
    logging.getLogger("fleetserve.fleet").debug("evicting", extra=kv(model="a/b", bytes=3))
    logging.getLogger("uvicorn.error").warning("from uvicorn")  # routed: the same style
    rows = [json.loads(x) for x in logs.getvalue().splitlines()]
    assert rows[0]["level"] == "debug" and rows[0]["msg"] == "evicting"
    assert rows[0]["model"] == "a/b" and rows[0]["bytes"] == 3 and rows[0]["tag"] == "worker-0"
    assert rows[0]["ts"].endswith("Z") and rows[1]["logger"] == "uvicorn.error"


def test_bad_log_settings_refuse(logs: io.StringIO) -> None:
    with pytest.raises(ValueError, match="log_format"):
        setup_logging(Settings(log_format="xml"), stream=logs)
    with pytest.raises(ValueError, match="log_level"):
        setup_logging(Settings(log_level="loud"), stream=logs)


def test_secrets_are_redacted_in_every_line(logs: io.StringIO) -> None:
    settings = _secret_settings()
    setup_logging(settings, stream=logs)
    log = logging.getLogger("fleetserve.queue")
    log.info("connecting to %s with %s", settings.nats, settings.api_key)
    log.warning("s3 said %s", f"bad signature for {S3_SECRET}", extra=kv(key=SECRET_KEY))
    log.info("payloads at s3://AKIAXX:other-secret@bucket/p, header Bearer abc.def-123456789")
    log.info("a new key %s", key := new_key())
    text = logs.getvalue()
    for secret in (SECRET_KEY, S3_SECRET, NATS_PASS, "other-secret", "abc.def-123456789", key):
        assert secret not in text
    assert "nats://***@127.0.0.1:4222" in text  # the host stays readable
    assert repr(settings).count("***") >= 3  # Settings' own redaction, which this mirrors


def test_redactor_keeps_urls_without_credentials() -> None:
    r = Redactor.from_settings(Settings(nats="nats://127.0.0.1:4222"))
    assert r("connect nats://127.0.0.1:4222") == "connect nats://127.0.0.1:4222"


def test_request_ids_from_clients_must_be_sane() -> None:
    assert request_id("abc-123") == "abc-123"
    forged = request_id("x\nINFO fake")
    assert "\n" not in forged and len(forged) == 32
    assert request_id("a" * 500) != "a" * 500


def test_ready_summary_is_short_for_a_big_catalog() -> None:
    class R:
        def __init__(self, loaded: bool) -> None:
            self.loaded = loaded

    runners = {f"org/model-{i}": R(i < 3) for i in range(17)}
    line = "worker w1 ready: " + ready_summary(runners, "cpu")
    assert line == "worker w1 ready: 3 loaded, 14 on demand, device cpu"
    assert ready_summary({"a/b": R(True)}, ["cpu:0", "cpu:1"]) == "a/b loaded, devices cpu:0, cpu:1"


def test_library_progress_bars_are_off(logs: io.StringIO) -> None:
    setup_logging(Settings(), stream=logs)
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as tlog

    assert are_progress_bars_disabled() and not tlog.is_progress_bar_enabled()
    tlog.get_logger("transformers.modeling_utils").warning("weights not initialized")
    assert "WARN  transformers: weights not initialized" in logs.getvalue()  # our style
    env = child_env({"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert set(CHILD_ENV) <= set(env)


@pytest.fixture(scope="module")
def secret_server(tiny_catalog: Path) -> Iterator[ServerThread]:
    settings = tiny_settings(
        tiny_catalog,
        api_key=SECRET_KEY,
        s3_secret_access_key=S3_SECRET,
        max_body_bytes=4096,
        log_format="json",
    )
    srv = ServerThread(settings).start()
    yield srv
    srv.stop()


def test_access_lines_and_headers_for_every_outcome(
    secret_server: ServerThread, logs: io.StringIO
) -> None:
    setup_logging(secret_server.settings, stream=logs)
    auth = {"authorization": f"Bearer {SECRET_KEY}"}
    url = secret_server.url
    calls = [
        ("ok", f"/v1/encode/{TINY}", {"inputs": ["hi"]}, auth, 200),
        ("bad-json", f"/v1/encode/{TINY}", None, auth, 400),
        ("no-key", f"/v1/encode/{TINY}", {"inputs": "x"}, {"authorization": "Bearer nope"}, 401),
        ("unknown", "/v1/encode/no/such-model", {"inputs": "x"}, auth, 404),
        ("too-big", f"/v1/encode/{TINY}", {"inputs": "x" * 8000}, auth, 413),
        ("late", f"/v1/encode/{TINY}", {"inputs": ["x"] * 64},
         {**auth, "x-request-timeout": "0.000001"}, 504),
    ]  # fmt: skip
    with httpx.Client(base_url=url, timeout=30) as client:
        for rid, path, body, headers, status in calls:
            h = {**headers, "x-request-id": rid, "content-type": "application/json"}
            content = b"{not json" if body is None else json.dumps(body).encode()
            r = client.post(path, content=content, headers=h)
            assert r.status_code == status, (rid, r.text)
            assert r.headers["x-request-id"] == rid
            for name in ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms"):
                assert float(r.headers[name]) >= 0.0, (rid, name)
        client.get("/readyz", headers={"x-request-id": "probe"})  # probes: debug level
    text = logs.getvalue()
    assert SECRET_KEY not in text and S3_SECRET not in text and "nope" not in text
    assert '"probe"' not in text
    lines = [json.loads(x) for x in text.splitlines()]
    access = {x["id"]: x for x in lines if x["logger"] == "fleetserve.access"}
    for rid, path, _, _, status in calls:
        line = access[rid]
        assert line["msg"].startswith(f"POST {path} {status} "), line
    ok = access["ok"]
    assert ok["model"] == TINY and ok["tenant"] == "default" and ok["bytes_out"] > 0
    assert "queue_ms" in ok and "inference_ms" in ok and ok["priority"] == "interactive"
    assert access["unknown"]["code"] == "model_not_found" and access["late"]["level"] == "warning"
    assert access["no-key"]["code"] == "unauthorized" and "tenant" not in access["no-key"]


def test_two_requests_with_one_client_id_both_get_their_reply(
    secret_server: ServerThread, logs: io.StringIO
) -> None:
    """The id keys the queue's pending replies (and JetStream's de-duplication): the
    queue gets a unique one, the client and the log see its own."""
    setup_logging(secret_server.settings, stream=logs)
    headers = {
        "authorization": f"Bearer {SECRET_KEY}",
        "x-request-id": "twin",
        "x-request-timeout": "5",  # the old collision: one of them waited this long
    }
    path = f"/v1/encode/{TINY}"

    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=secret_server.url, timeout=10) as c:
            one, two = await asyncio.gather(
                c.post(path, json={"inputs": ["a"]}, headers=headers),
                c.post(path, json={"inputs": ["b", "c"]}, headers=headers),
            )
        return one, two

    t0 = time.perf_counter()
    one, two = asyncio.run(both())
    assert one.status_code == 200 and two.status_code == 200, (one.text, two.text)
    assert time.perf_counter() - t0 < 4
    assert one.headers["x-request-id"] == two.headers["x-request-id"] == "twin"
    assert len(one.json()["embeddings"]) == 1 and len(two.json()["embeddings"]) == 2
    deadline = time.monotonic() + 5
    while logs.getvalue().count('"id": "twin"') < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # the lines follow the responses
    lines = [json.loads(x) for x in logs.getvalue().splitlines()]
    twins = [x for x in lines if x["logger"] == "fleetserve.access" and x.get("id") == "twin"]
    assert len(twins) == 2 and all(x["msg"].startswith(f"POST {path} 200 ") for x in twins)


def test_access_log_can_be_turned_off(tiny_catalog: Path, logs: io.StringIO) -> None:
    settings = tiny_settings(tiny_catalog, access_log=False, models="tiny/*")
    srv = ServerThread(settings).start()
    try:
        setup_logging(settings, stream=logs)
        r = httpx.get(srv.url + "/v1/nowhere")
        assert r.status_code == 404 and r.headers["x-request-id"]
    finally:
        srv.stop()
    assert "access:" not in logs.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_librarys_terminal_escapes_never_reach_the_log(logs: io.StringIO, fmt: str) -> None:
    """transformers colours its load report (``\\x1b[1m``): the log has the words only."""
    setup_logging(Settings(log_format=fmt), stream=logs)
    logging.getLogger("transformers.modeling_utils").warning(
        "load report: \x1b[1mUNEXPECTED\x1b[0m keys \x1b[31;1mbert.pooler\x1b[0m"
    )
    line = logs.getvalue().strip().splitlines()[-1]
    assert "\x1b" not in line and "\\u001b" not in line
    assert "load report: UNEXPECTED keys bert.pooler" in line


def test_library_noise_is_dropped_and_its_real_warnings_kept(logs: io.StringIO) -> None:
    """transformers' `loss_type=None` warning came on every model load; a library's
    warning that says something still comes through."""
    setup_logging(Settings(), stream=logs)
    tlog = logging.getLogger("transformers.modeling_utils")
    tlog.warning(
        "`loss_type=None` was set in the config but it is unrecognized. Using the default "
        "loss: `ForCausalLMLoss`."
    )
    tlog.warning("Some weights of BertModel were not initialized from the checkpoint")
    out = logs.getvalue()
    assert "loss_type" not in out and "Some weights of BertModel were not initialized" in out


@pytest.mark.slow  # a model converted for OpenVINO and served
def test_a_model_load_logs_only_what_means_something(logs: io.StringIO, tmp_path: Path) -> None:
    """Loading and serving a model (converted for OpenVINO, where transformers used to
    warn about `loss_type=None`) leaves no library warning in the log, and one line
    saying it loaded."""
    from .tinymodels import build_bert, write_spec

    cat = tmp_path / "catalog"
    write_spec(cat, "tiny/ov", build_bert(tmp_path / "model"), runtime="openvino",
               profiles={"cpu": {"precision": "fp32", "max_batch_tokens": 256}})  # fmt: skip
    settings = tiny_settings(cat, models="tiny/ov", cache_dir=str(tmp_path / "cache"))
    setup_logging(settings, stream=logs)
    srv = ServerThread(settings).start()
    try:
        r = httpx.post(f"{srv.url}/v1/encode/tiny/ov", json={"inputs": ["hello"]}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
    lines = logs.getvalue().splitlines()
    warned = [ln for ln in lines if " WARN " in ln or " ERROR " in ln]
    assert not warned, warned
    assert sum("loaded tiny/ov in " in ln for ln in lines) == 1, lines
