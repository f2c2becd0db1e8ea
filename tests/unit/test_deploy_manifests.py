"""deploy/kuberay manifests: valid YAML of the right kinds, and the RayService's Serve
application args pass the same validation `serve run` applies (serving.schemas.ServeSettings)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rag.errors import ConfigError

KUBERAY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"


def test_rayservice_serve_config_validates() -> None:
    from serving.schemas import ServeSettings

    svc = yaml.safe_load((KUBERAY / "rayservice.yaml").read_text())
    assert (svc["apiVersion"], svc["kind"]) == ("ray.io/v1", "RayService")
    serve_cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])
    (app,) = serve_cfg["applications"]
    assert app["import_path"] == "serving.app:build_app"
    s = ServeSettings.from_args(app["args"])
    assert s.store_url.startswith("postgresql") and s.auth.enabled
    assert s.traffic.canary_percent == 5.0 and s.pipelines.num_replicas == 2
    head = svc["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    bad = {**app["args"], "traffic": {"canary_percent": 150}}
    with pytest.raises(ConfigError) as e:
        ServeSettings.from_args(bad)
    assert "canary_percent" in e.value.field


def test_raycluster_groups() -> None:
    rc = yaml.safe_load((KUBERAY / "raycluster.yaml").read_text())
    assert rc["kind"] == "RayCluster"
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "RAGPILOT_FAISS_DEVICE", "value": "gpu"} in gpu["env"]
