"""deploy/kuberay/networkpolicy.yaml closes what docs/operations.md ("What listens where") says
a firewall must close: it selects every pod template of the RayService, lets the RayService's
own pods reach each other on any port (the replicas' gRPC ports are ephemeral), and lets
anything else reach only the Serve HTTP port of the RayService's `http_options` (and the
KubeRay operator the dashboard). Parsed, not applied."""

from __future__ import annotations

from pathlib import Path

import yaml

KUBERAY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"


def _templates(svc: dict) -> list[dict]:
    spec = svc["spec"]["rayClusterConfig"]
    return [spec["headGroupSpec"]["template"],
            *(g["template"] for g in spec["workerGroupSpecs"])]


def test_policy_selects_every_pod_and_opens_only_the_serve_port() -> None:
    svc = yaml.safe_load((KUBERAY / "rayservice.yaml").read_text())
    pol = yaml.safe_load((KUBERAY / "networkpolicy.yaml").read_text())
    assert (pol["apiVersion"], pol["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    selector = pol["spec"]["podSelector"]["matchLabels"]
    for t in _templates(svc):
        labels = t.get("metadata", {}).get("labels", {})
        assert selector.items() <= labels.items(), (selector, labels)

    serve_port = yaml.safe_load(svc["spec"]["serveConfigV2"])["http_options"]["port"]
    rules = pol["spec"]["ingress"]
    # from the RayService's own pods: every port (no `ports`: the gRPC ports are ephemeral)
    peers = [r for r in rules if "ports" not in r]
    assert peers == [{"from": [{"podSelector": {"matchLabels": selector}}]}], rules
    # from anywhere: the Serve port only
    anywhere = [r for r in rules if "from" not in r]
    assert anywhere == [{"ports": [{"protocol": "TCP", "port": serve_port}]}], rules
    # everything else names both its source and its ports, and no rule opens a port range
    for r in rules:
        assert r in peers or r in anywhere or (r.get("from") and r.get("ports")), r
        assert all("endPort" not in p for p in r.get("ports", [])), r
