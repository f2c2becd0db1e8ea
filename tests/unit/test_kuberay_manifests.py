"""deploy/kuberay and runbooks/ray_cluster.md say what a cluster needs, and say it the same way
(issue 23): parsed, not run (no Ray, no Kubernetes).

- every group (head and workers) of the RayService and of the jobs RayCluster mounts the
  API-key secret and the rollout volume where the Serve args read them: the ingress and the
  jobs run on workers (the heads offer no CPU);
- every claim the manifests mount is declared ReadWriteMany in volumes.yaml (pods on several
  nodes mount it);
- a group that asks Kubernetes for GPUs tells Ray about them (`num-gpus`), and the GPU group
  asks for one;
- every `ray job submit` in the runbook reserves entrypoint CPUs (the jobs head has
  `num-cpus: "0"`), a training job GPUs, its runtime-env JSON parses, and its `ragpilot`
  command parses with the CLI's own parser;
- the runbook's two-nodes-on-one-machine commands use the flags tests/support/ray_cluster.py
  starts the test cluster with.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path, PurePosixPath

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
RUNBOOK = REPO / "runbooks" / "ray_cluster.md"
KEYS_SECRET, ROLLOUT_CLAIM = "ragpilot-api-keys", "ragpilot-rollout"


def _load(name: str):
    return yaml.safe_load((KUBERAY / name).read_text())


def _serve_args() -> dict:
    svc = _load("rayservice.yaml")
    (app,) = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    return app["args"]


def _clusters() -> dict[str, dict]:
    return {"rayservice": _load("rayservice.yaml")["spec"]["rayClusterConfig"],
            "raycluster": _load("raycluster.yaml")["spec"]}


def _groups(cluster: dict) -> dict[str, dict]:
    return {"head": cluster["headGroupSpec"],
            **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}


def _mounts(group: dict) -> dict[str, tuple[str, dict]]:
    """volume source kind+name -> (mount path, volume) for the group's first container."""
    pod = group["template"]["spec"]
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for m in pod["containers"][0].get("volumeMounts", []):
        v = vols[m["name"]]
        if "secret" in v:
            out[f"secret/{v['secret']['secretName']}"] = (m["mountPath"], v)
        if "persistentVolumeClaim" in v:
            out[f"pvc/{v['persistentVolumeClaim']['claimName']}"] = (m["mountPath"], v)
    return out


@pytest.mark.parametrize("name", ["rayservice", "raycluster"])
def test_every_group_mounts_the_keys_and_the_rollout_state(name):
    args = _serve_args()
    keys_dir = PurePosixPath(args["auth"]["keys_file"]).parent
    rollout = PurePosixPath(args["rollout_dir"])
    cluster = _clusters()[name]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group, spec in _groups(cluster).items():
        m = _mounts(spec)
        assert f"secret/{KEYS_SECRET}" in m, (name, group)
        assert PurePosixPath(m[f"secret/{KEYS_SECRET}"][0]) == keys_dir, (name, group)
        assert f"pvc/{ROLLOUT_CLAIM}" in m, (name, group)
        assert rollout.is_relative_to(m[f"pvc/{ROLLOUT_CLAIM}"][0]), (name, group)


def test_jobs_groups_share_data_and_cache():
    for group, spec in _groups(_clusters()["raycluster"]).items():
        m = _mounts(spec)
        assert "pvc/ragpilot-data" in m, group
        env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
        for var in ("RAGPILOT_DATA", "RAGPILOT_CACHE"):
            assert PurePosixPath(env[var]).is_relative_to(m["pvc/ragpilot-data"][0]), (group, var)


def test_claims_are_declared_read_write_many():
    declared = {d["metadata"]["name"]: d for d in yaml.safe_load_all(
        (KUBERAY / "volumes.yaml").read_text()) if d and d["kind"] == "PersistentVolumeClaim"}
    used = {k.split("/", 1)[1] for c in _clusters().values() for g in _groups(c).values()
            for k in _mounts(g) if k.startswith("pvc/")}
    assert used and used <= set(declared)
    for claim in used:
        assert declared[claim]["spec"]["accessModes"] == ["ReadWriteMany"], claim


def test_gpu_requests_reach_ray():
    for name, cluster in _clusters().items():
        for group, spec in _groups(cluster).items():
            res = spec["template"]["spec"]["containers"][0]["resources"]
            gpus = res.get("limits", {}).get("nvidia.com/gpu")
            assert gpus == res.get("requests", {}).get("nvidia.com/gpu"), (name, group)
            assert spec["rayStartParams"].get("num-gpus") == gpus, (name, group)
    gpu = _groups(_clusters()["raycluster"])["gpu"]
    assert gpu["rayStartParams"]["num-gpus"] == "1"


# ---- the runbook's shell blocks -------------------------------------------------------------
def _commands() -> list[list[str]]:
    """Every command of the runbook's ```bash blocks, continuation lines joined (a quoted
    argument may span lines), as shlex words without comments."""
    text = RUNBOOK.read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    out = []
    for block in blocks:
        pending = ""
        for line in block.splitlines():
            pending += line + "\n"
            if pending.rstrip().endswith("\\") or pending.count("'") % 2:
                continue
            words = shlex.split(pending.replace("\\\n", " "), comments=True)
            if words:
                out.append(words)
            pending = ""
        assert not pending.strip(), pending
    return out


def _option(words: list[str], name: str) -> str | None:
    for i, w in enumerate(words):
        if w == name:
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


def _submits() -> list[tuple[list[str], list[str]]]:
    subs = []
    for words in _commands():
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]  # VAR=value prefixes
        if words[:3] == ["ray", "job", "submit"]:
            cut = words.index("--")
            subs.append((words[:cut], words[cut + 1:]))
    return subs


def test_job_submissions_reserve_entrypoint_resources():
    from serving.cli import build_parser

    subs = _submits()
    assert len(subs) >= 4
    parser = build_parser()
    asked_gpu = False
    for opts, entry in subs:
        assert float(_option(opts, "--entrypoint-num-cpus") or 0) >= 1, opts
        gpus = float(_option(opts, "--entrypoint-num-gpus") or 0)
        asked_gpu |= gpus > 0
        if entry[1] in ("train-generator", "train-reranker"):
            assert gpus >= 1, entry
        env = _option(opts, "--runtime-env-json")
        if env is not None:
            assert isinstance(json.loads(env)["env_vars"], dict)
        assert entry[0] == "ragpilot", entry
        parser.parse_args(entry[1:])  # SystemExit on an argument the CLI does not take
        policy = _option(entry, "--settings")
        if policy is not None:
            assert (REPO / policy).is_file(), policy
    assert asked_gpu
    tunes = [e for _, e in subs if e[1] == "tune"]
    assert tunes and all(_option(e, "--settings") == "configs/rl/tuner.cluster.yaml"
                         for e in tunes)


def test_cluster_policy_gives_ppo_remote_env_runners():
    from rl.kernel.settings import TunerSettings

    p = TunerSettings.from_yaml(REPO / "configs" / "rl" / "tuner.cluster.yaml").ppo
    assert p.num_env_runners >= 1 and p.train_batch_size % p.num_env_runners == 0
    assert TunerSettings.defaults().ppo.num_env_runners == 0  # one machine: as before


def _flags(words: list[str]) -> dict[str, str]:
    out = {}
    for w in words[2:]:
        k, _, v = w.partition("=")
        out[k] = v
    return out


def test_two_node_commands_match_the_test_cluster():
    from tests.support.ray_cluster import head_command, worker_command

    starts = [w for w in _commands() if w[:2] == ["ray", "start"]
              and _option(w, "--resources") in ('{"head": 1}', '{"worker_node": 1}')]
    head = next(_flags(w) for w in starts if "--head" in w)
    worker = next(_flags(w) for w in starts if "--head" not in w)
    # ports and temp dirs are the runbook's examples; the test picks free ones
    varying = {"--port", "--temp-dir", "--address", "--block", "--ray-client-server-port",
               "--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
               "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
               "--metrics-export-port"}
    for book, test in ((head, _flags(head_command(1, "/t"))),
                       (worker, _flags(worker_command(1, "/t")))):
        assert {k: v for k, v in book.items() if k not in varying} == \
            {k: v for k, v in test.items() if k not in varying}
    # a second node on the same host must not take the head's default agent ports
    assert {"--dashboard-agent-listen-port", "--runtime-env-agent-port",
            "--metrics-export-port"} <= set(worker)
    assert _option(next(w for w in starts if "--head" not in w), "--address") == \
        f"127.0.0.1:{head['--port']}"
