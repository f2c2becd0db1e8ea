"""bench/gpu_grpo.py's device step on this CPU: `run --smoke` with a tiny randomly initialised
Llama (SmolLM2's tokenizer and chat template) as the SFT policy, on a hand-made cargo, in a
subprocess that must not import the parts of the stack a device machine lacks; then `ingest`.
The real GPU run is bench/results/gpu_grpo_run1.md; GRPO on the real SmolLM2 weights runs in
tests/test_grpo_smoke.py."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from tests.conftest import tiny_smollm2_llama

REPO = Path(__file__).resolve().parents[1]
CTX = [{"id": "p1", "title": "Paris", "text": "Paris is the capital and largest city of France.",
        "score": 1.0},
       {"id": "p2", "title": "Rome", "text": "Rome is the capital city of Italy.", "score": 0.5}]
QS = [("What is the capital of France?", "Paris", [1]), ("What is the capital of Italy?", "Rome",
                                                          [2])] * 2


def _gz(path: Path, obj) -> None:
    with gzip.open(path, "wt") as f:
        json.dump(obj, f)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_grpo")
    tiny_smollm2_llama(tmp / "tiny")
    base = tmp / "cargo" / "base"
    base.mkdir(parents=True)
    (base / "plan.json").write_text(json.dumps({"sft": {"ref": "tiny"}, "settings": {}}))
    _gz(base / "grpo_train.json.gz",
        [{"id": f"t{i}", "question": q, "target": f"{a} [{g[0]}]", "answers": [a],
          "gold_positions": g, "contexts": CTX} for i, (q, a, g) in enumerate(QS)])
    for split in ("valid", "test"):
        _gz(base / f"contexts-{split}-300.json.gz",
            {"split": split, "ids": [f"{split}{i}" for i in range(4)],
             "questions": [q for q, _, _ in QS], "answers": [[a] for _, a, _ in QS],
             "contexts": [CTX] * 4, "gold_positions": [g for _, _, g in QS]})
    out = tmp / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/gpu_grpo.py"), "run", "--device", "cpu", "--smoke",
         "--policy-dir", str(tmp / "tiny"), "--cargo", str(tmp / "cargo"), "--out", str(out),
         "--work", str(tmp / "work")], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "run.json").read_text())


def test_device_step_trains_selects_on_valid_and_answers_test(grpo_run):
    out, info = grpo_run
    # no Ray, tantivy or FAISS there (transformers' trainer imports MLflow where it is
    # installed, as here; the device has none and ran without it)
    assert not set(info["heavy_modules_imported"]) & {"ray", "tantivy", "faiss"}
    assert info["grpo"]["steps_done"] == 2 and info["grpo"]["settings"]["n_train"] == 4
    assert any("reward" in r for r in info["train_log"])
    # the SFT policy and every evaluated checkpoint answered valid; the best one was chosen
    assert set(info["valid_f1"]) == {"smollm2-sft", "grpo-1", "grpo-2"}
    best = max(v for k, v in info["valid_f1"].items() if k != "smollm2-sft")
    assert info["valid_f1"][info["chosen"]] == best
    test = json.loads((out / "eval-test.json").read_text())
    assert set(test["systems"]) == {"smollm2-sft", "smollm2-grpo"}
    assert all(len(s["f1"]) == 4 for s in test["systems"].values())
    with tarfile.open(out / "adapters.tar") as tar:
        names = set(tar.getnames())
    assert f"{info['chosen']}/adapter_model.safetensors" in names


def test_ingest_writes_the_paired_delta(grpo_run, tmp_path, monkeypatch):
    import bench.common
    import bench.gpu_grpo as g

    out, _ = grpo_run
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    import bench.generator_adaptation as ga

    monkeypatch.setattr(ga, "PARTS", tmp_path / "parts")  # no CPU-protocol part: device rows only
    g.ingest(out, quick=True)
    res = json.loads((tmp_path / "gpu_grpo.quick.json").read_text())
    rows = {(r["system"], r["metric"]): r for r in res["rows"]}
    test = json.loads((out / "eval-test.json").read_text())["systems"]
    d = rows[("smollm2-grpo - smollm2-sft", "delta_answer_f1")]
    want = (sum(test["smollm2-grpo"]["f1"]) - sum(test["smollm2-sft"]["f1"])) / 4
    assert d["n"] == 4 and d["value"] == pytest.approx(want)
    assert ("smollm2-grpo - smollm2-sft", "delta_citation_precision") in rows
    assert not any(r["system"].startswith("smollm2-grpo-gpu") for r in res["rows"])
    toks = rows[("smollm2-grpo", "tokens_out")]
    assert toks["value"] == pytest.approx(sum(test["smollm2-grpo"]["tokens_out"]) / 4)


def test_quant_ingest_reads_a_cut_qlora_log(tmp_path):
    from bench.gpu_quant import qlora_progress

    log = tmp_path / "run.log"
    log.write_text("noise\n[sft] step 25/125 loss 0.7300 eval_em 0.000 eval_f1 0.298 "
                   "eval_citation_precision 1.000 eval_n 16.000\nMatMul8bitLt: ...\n"
                   "[sft] step 50/125 loss 0.6124 eval_em 0.000 eval_f1 0.384 eval_n 16.000\n")
    assert qlora_progress(log) == [
        {"step": 25, "total": 125, "loss": 0.73, "eval_f1": 0.298},
        {"step": 50, "total": 125, "loss": 0.6124, "eval_f1": 0.384}]


def test_out_of_memory_halves_the_micro_batch_for_the_budget_left():
    """The device step's fallback (the real trainer runs above; here a stand-in raises the
    CUDA error a 64-completion micro-batch would)."""
    import torch
    from bench.gpu_grpo import train_with_fallback

    from rl.adaptation.grpo import GRPOSettings

    calls, cleaned, info = [], [], {}

    def train(s):
        calls.append(s)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return {"steps_done": 3}

    s = GRPOSettings().replace(prompts_per_step=16, num_generations=8, micro_batch=64,
                               max_seconds=330.0)
    assert train_with_fallback(train, s, info, lambda: cleaned.append(1)) == {"steps_done": 3}
    assert [c.micro_batch for c in calls] == [64, 32] and cleaned == [1]
    assert 300 < calls[1].max_seconds <= 330.0
    assert info["oom_fallback"]["micro_batch"] == 64 and info["oom_fallback"]["to"] == 32
    assert "Tried to allocate" in info["oom_fallback"]["error"]
    info.clear()
    assert train_with_fallback(lambda st: {"ok": st.micro_batch}, s, info, None) == {"ok": 64}
    assert info == {}
