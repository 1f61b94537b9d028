"""Values a pool or the gateway sets to 0, false or empty are kept (Helm's ``default``
takes those for unset), KEDA trigger names are unique DNS labels, and the job label the
ServiceMonitor gives workers is the one the alert rules select."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chart import by_kind, helm, manifests, one, render

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
WORKER = "demo-fleetserve-worker-p"
GATEWAY = "demo-fleetserve-gateway"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yaml"


def pool(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "p", "device": "cpu", "pinned": [MINILM]}
    base.update(over)
    return base


def pdbs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "PodDisruptionBudget")}


def test_pdbs_can_be_turned_off() -> None:
    docs = manifests({"workerPools": [pool(pdb={"enabled": False})], "gateway": {"pdb": {}}})
    assert set(pdbs(docs)) == {GATEWAY}
    docs = manifests({"gateway": {"pdb": {"enabled": False}}, "workerPools": [pool()]})
    assert set(pdbs(docs)) == {WORKER}  # on unless the pool says otherwise


def test_pdb_budgets_of_zero_and_either_kind() -> None:
    values = {
        "workerPools": [pool(pdb={"maxUnavailable": 0}), pool(name="q", pdb={"minAvailable": 1})],
        "gateway": {"pdb": {"minAvailable": 0}},
    }
    docs = manifests(values)
    kv = pytest.importorskip("kubernetes_validate")
    for doc in by_kind(docs, "PodDisruptionBudget"):
        kv.validate(doc, "1.30.0", strict=True)
    got = pdbs(docs)
    assert got[WORKER]["maxUnavailable"] == 0 and "minAvailable" not in got[WORKER]
    assert got["demo-fleetserve-worker-q"]["minAvailable"] == 1
    assert "maxUnavailable" not in got["demo-fleetserve-worker-q"]
    assert got[GATEWAY]["minAvailable"] == 0
    assert pdbs(manifests({"workerPools": [pool()]}))[WORKER]["maxUnavailable"] == 1
    gw = {"gateway": {"pdb": {"minAvailable": None, "maxUnavailable": "50%"}}}
    got = pdbs(manifests(gw))
    assert got[GATEWAY]["maxUnavailable"] == "50%" and "minAvailable" not in got[GATEWAY]
    with pytest.raises(helm.HelmRenderError, match=r"gateway.pdb: set minAvailable or max"):
        render({"gateway": {"pdb": {"maxUnavailable": 1}}})  # minAvailable 1 is the default


@pytest.mark.parametrize("off", [{"keda": {"enabled": False}}, {}])
def test_a_pool_of_zero_replicas(off: dict[str, Any]) -> None:
    scaling = {} if off else {"enabled": False}
    values = {**off, "workerPools": [pool(replicas=0, scaling=scaling)]}
    assert one(manifests(values), "Deployment", WORKER)["spec"]["replicas"] == 0
    values = {**off, "workerPools": [pool(scaling=scaling)]}
    assert one(manifests(values), "Deployment", WORKER)["spec"]["replicas"] == 1


def test_keda_zero_cooldown_and_replicas_checked() -> None:
    values = {"workerPools": [pool(scaling={"cooldownPeriod": 0})]}
    (so,) = by_kind(manifests(values), "ScaledObject")
    assert so["spec"]["cooldownPeriod"] == 0 and so["spec"]["pollingInterval"] == 5
    (so,) = by_kind(manifests({"workerPools": [pool()]}), "ScaledObject")
    assert so["spec"]["cooldownPeriod"] == 300
    with pytest.raises(helm.HelmRenderError, match=r"maxReplicas \(2\) is below .*Replicas \(3"):
        render({"workerPools": [pool(scaling={"minReplicas": 3, "maxReplicas": 2})]})


def test_a_pool_may_empty_what_its_device_type_gives() -> None:
    gpu = {"name": "g", "device": "cuda", "pinned": [MINILM]}
    values = {"workerPools": [{**gpu, "tolerations": [], "resources": {}, "imageVariant": ""}]}
    spec = one(manifests(values), "Deployment", "demo-fleetserve-worker-g")["spec"]["template"]
    spec = spec["spec"]
    assert "tolerations" not in spec and "resources" not in spec["containers"][0]
    assert spec["containers"][0]["image"].endswith(":0.1.0")  # not -cuda
    spec = one(manifests({"workerPools": [gpu]}), "Deployment", "demo-fleetserve-worker-g")
    inner = spec["spec"]["template"]["spec"]
    assert inner["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert inner["containers"][0]["image"].endswith(":0.1.0-cuda")


def test_trigger_names_are_unique_dns_labels() -> None:
    prefix = "org/" + "a" * 56  # 60 characters in common
    ids = [f"{prefix}-one", f"{prefix}-two", "Org/Model", "org/model", "x/y_", "z.-"]
    (so,) = by_kind(manifests({"workerPools": [pool(pinned=ids)]}), "ScaledObject")
    names = [t["name"] for t in so["spec"]["triggers"]]
    assert len(names) == 2 * len(ids) == len(set(names)), names
    bad = [n for n in names if not DNS_LABEL.match(n)]
    assert bad == []
    by_consumer = {t["metadata"]["consumer"]: t["name"] for t in so["spec"]["triggers"]}
    assert by_consumer["w-org_2Fmodel"].startswith("batch-org-model-")
    assert by_consumer["wi-Org_2FModel"].startswith("interactive-org-model-")


def test_the_alerts_select_the_job_the_service_monitor_gives_workers() -> None:
    docs = manifests({"workerPools": [pool()]})
    (sm,) = by_kind(docs, "ServiceMonitor")
    key = sm["spec"]["jobLabel"]
    jobs = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s["metadata"]["labels"][key]
            for s in by_kind(docs, "Service")}  # fmt: skip
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    (down,) = [r for r in rules if r["alert"] == "FleetserveWorkerDown"]
    matchers = re.findall(r'(\w+)\{job=~"([^"]+)"\}', down["expr"])
    assert {m for m, _ in matchers} == {"fleetserve_worker_up", "up"}
    for _, regex in matchers:  # Prometheus anchors label regexes
        assert re.fullmatch(regex, jobs["worker"]) and not re.fullmatch(regex, jobs["gateway"])
        assert re.fullmatch(regex, "demo-fleetserve-worker-p")  # a job named by Service
