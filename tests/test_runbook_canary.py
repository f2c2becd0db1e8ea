"""runbooks/canary_promotion.md's walkthrough, run as written against a running server: the
fenced blocks after the `rollout-walkthrough` markers run in bash, from the directory the
server was started in, with the defaults the runbook states (`runs/my-tune/serve.yaml` as
`ragpilot tune` writes it: stable = the default config, canary = the tuned one at 0%), and every
`curl` line the CLI prints is run as the runbook says. Simulated users send the synthetic
world's questions between the steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = REPO / "runbooks" / "canary_promotion.md"


def _blocks() -> dict[str, str]:
    text = RUNBOOK.read_text()
    found = re.findall(r"<!-- rollout-walkthrough:(\w+) -->\n```bash\n(.*?)```", text, re.S)
    return dict(found)


def test_walkthrough_blocks_are_the_documented_path():
    b = _blocks()
    assert list(b) == ["start", "advance", "rollback"]
    start = [ln.split()[:3] for ln in b["start"].splitlines() if ln.startswith("ragpilot")]
    assert [w[1:3] for w in start] == [["rollout", "status"], ["export-interactions", "--store"],
                                      ["rollout", "replay"], ["rollout", "start"],
                                      ["rollout", "advance"]]
    from serving.cli import build_parser

    parser = build_parser()
    for block in b.values():
        for line in block.splitlines():
            if line.startswith("ragpilot"):
                words = [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', line)]
                parser.parse_args([w.replace("$S", "s.yaml") for w in words[1:]])


def _run(block: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", "set -uo pipefail\n" + block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _apply_printed(out: str, cwd: Path, env: dict, url: str) -> dict:
    """Run the `curl` line the CLI printed (the runbook says: run it); its JSON answer."""
    lines = [ln.split("apply on the Serve app: ", 1)[1] for ln in out.splitlines()
             if "apply on the Serve app: curl" in ln]
    assert lines, out
    assert f"{url}/admin/traffic" in lines[-1]  # the server's real address, not a guess
    proc = subprocess.run(["bash", "-c", lines[-1]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.ray
@pytest.mark.slow
def test_runbook_walkthrough_runs_as_written(tmp_path, serve_app):
    from rag.corpus.loaders import load_dataset
    from rl.kernel.settings import TunerSettings
    from rl.kernel.space import ConfigSpace
    from serving.auth import KeyFile
    from serving.serve_yaml import tuned_args, write_serve_yaml

    default = ConfigSpace(TunerSettings.defaults()).base
    tuned = default.model_copy(update={"variant": "bm25", "k": 4})  # the demo world's pick
    run = tmp_path / "runs" / "my-tune"
    run.mkdir(parents=True)
    (run / "best_config.yaml").write_text(tuned.to_yaml())
    keys = tmp_path / "keys.json"
    args = {**tuned_args("synthetic", default, tuned, run), "auth": {"keys_file": str(keys)},
            "limits": {"max_inflight": 8, "rate_per_s": 1000.0, "burst": 1000.0},
            "pipelines": {"num_replicas": 1, "autoscaling": None, "num_cpus": 0.1},
            "max_variants": 4, "restore_routing": False}
    serve_yaml = write_serve_yaml(run / "serve.yaml", args, "test")
    data = yaml.safe_load(serve_yaml.read_text())
    token, _ = KeyFile(keys).create("admin", name="runbook")
    questions = load_dataset("synthetic").examples
    env = {**os.environ, "RAGPILOT_ADMIN_KEY": token, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cwd = tmp_path
    os.chdir(cwd)  # the server runs from the operator's directory
    url = serve_app.deploy(data["applications"][0]["args"])  # the session's Serve runtime
    data["http_options"]["port"] = int(url.rsplit(":", 1)[1])  # what the server listens on
    serve_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    sent = 0

    def users(n: int) -> None:
        """n requests, then wait until their mirrored answers are logged too."""
        nonlocal sent
        with httpx.Client(base_url=url, timeout=60.0) as c:
            for i in range(n):
                ex = questions[(sent + i) % len(questions)]
                r = c.post("/query", json={"question": ex.question, "user_id": f"u{i % 7}"})
                assert r.status_code == 200, r.text
            deadline = time.time() + 60
            while c.get("/rl/stats").json().get("shadow_tasks_pending") and \
                    time.time() < deadline:
                time.sleep(0.2)
        sent += n

    try:
        users(40)  # the server has been serving: the log the replay reads
        b = _blocks()
        proc = _run(b["start"], cwd, env)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert f"no rollout in {run / 'rollout'}" in out  # status before start: exit 0
        assert "mirrored requests to show" in out  # start sized each metric
        assert "advance: candidate -> shadow" in out
        got = _apply_printed(proc.stdout, cwd, env, url)
        assert got["shadow"] and got["shadow_percent"] == 100.0
        for _ in range(8):  # batches of traffic, then the runbook's advance
            users(20)
            proc = _run(b["advance"], cwd, env)
            out = proc.stdout + proc.stderr
            assert proc.returncode in (0, 1), out[-4000:]
            if proc.returncode == 0:
                break
            assert "next: more traffic" in out and "quality:" in out, out[-3000:]
        assert "advance: shadow -> canary_5" in out, out[-4000:]
        assert "quality: non_inferior" in out or "quality: better" in out
        assert "tokens: better" in out
        got = _apply_printed(proc.stdout, cwd, env, url)
        assert got["canary_percent"] == 5.0
        # the same evidence again adds nothing: every row was counted
        again = _run(b["advance"], cwd, env)
        assert again.returncode == 1 and "no interaction rows newer" in again.stdout
        proc = _run(b["rollback"], cwd, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = _apply_printed(proc.stdout, cwd, env, url)
        assert got["canary"] is None and got["canary_percent"] == 0.0
        audit = (run / "rollout" / "audit.jsonl").read_text().splitlines()
        assert [json.loads(a)["to"] for a in audit] == ["candidate", "shadow", "canary_5",
                                                        "rolled_back"]
    finally:
        os.chdir(REPO)
