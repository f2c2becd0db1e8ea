"""`ragpilot train-reranker --submit --wait` against a real Ray head with its job server, on
this machine (tests/test_train_submit.py; runbooks/ray_cluster.md shows the same commands).

    python tests/support/job_submit.py ROOT OUT.json      # inside a private network namespace

Starts `ray start --head --include-dashboard=true` (1 CPU, loopback, own ports and temp dir,
its own process group), waits for the job server, writes a tiny training set (2 items, a
1-layer random BERT as the base model, so the job trains 1 step in seconds) and submits the
command with `--submit --wait`: the job runs `ragpilot train-reranker` as a Ray job with 1
entrypoint CPU; its log is the training's output. OUT.json: the CLI's exit code and output, the
job's registered model. The head is always stopped by its process group (never `ray stop`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support.ray_cluster import (  # noqa: E402
    OBJECT_STORE_BYTES,
    PGIDS_FILE,
    _env,
    _node_ports,
    _ray_bin,
    _wait_port,
    free_port,
)

MODEL_NAME = "submitted-ce"


def head_command(port: int, dashboard_port: int, temp_dir: Path) -> list[str]:
    """`ray start --head` with the dashboard (the job server) on 127.0.0.1:`dashboard_port`."""
    return ["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
            "--num-cpus=1", f"--temp-dir={temp_dir}", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--ray-client-server-port={free_port()}", *_node_ports(), "--block"]


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no job server at {url} after {timeout_s} s")


def training_inputs(root: Path) -> tuple[Path, Path]:
    """(run dir holding items.jsonl + sources.json, tiny base model dir)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rag.models import ModelRegistry
    from rl.adaptation.data import TrainItem, save_items

    base = root / "tiny-bert"
    tok = AutoTokenizer.from_pretrained(str(ModelRegistry().get("minilm").resolve()))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)).save_pretrained(base)
    tok.save_pretrained(base)
    run = root / "run"
    run.mkdir(parents=True, exist_ok=True)
    save_items([TrainItem("toy", f"q{i}", f"what about {w}?", f"{w} evidence about {w}.",
                          ("opera facts.", "comet facts.", "desert facts."), ())
                for i, w in enumerate(("statin", "violin"))], run / "items.jsonl")
    (run / "sources.json").write_text(json.dumps({"toy": {"items": 2}}))
    return run, base


def main(root: Path, out: Path) -> None:
    from serving.cli import main as ragpilot

    root.mkdir(parents=True, exist_ok=True)
    report: dict = {}
    port, dash = free_port(), free_port()
    url = f"http://127.0.0.1:{dash}"
    env = {**_env(), "RAGPILOT_CACHE": str(root / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = root / "head.log"
    with log.open("w") as f:
        proc = subprocess.Popen([_ray_bin(), *head_command(port, dash, root / "ray")[1:]],
                                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
    (root / PGIDS_FILE).write_text(f"{proc.pid}\n")
    t0 = time.perf_counter()
    try:
        _wait_port(port, proc, 90)
        _wait_http(url, proc, 90)
        report["head_ready_s"] = time.perf_counter() - t0
        run, base = training_inputs(root)
        os.environ["RAGPILOT_CACHE"] = env["RAGPILOT_CACHE"]  # forwarded to the job
        argv = ["train-reranker", "--run-dir", str(run),
                "--set", f"name={MODEL_NAME}", "--set", f"base_model={base}",
                "--set", "max_length=32", "--set", "group_size=2", "--set", "batch_groups=2",
                "--set", "eval=null", "--set", "mlflow=false", "--set", "threads=1",
                "--submit", "--job-address", url, "--cpus", "1", "--working-dir", str(REPO),
                "--wait"]
        buf = io.StringIO()
        t1 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            report["rc"] = ragpilot(argv)
        report["job_s"] = time.perf_counter() - t1
        report["stdout"] = buf.getvalue()
        from rag.models import local_registry_path

        reg = local_registry_path()  # under RAGPILOT_CACHE: what the job registered
        report["registry"] = reg.read_text() if reg.exists() else None
    except BaseException as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["head_log"] = log.read_text(errors="replace")[-4000:]
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
