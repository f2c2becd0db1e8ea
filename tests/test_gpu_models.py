"""bench/gpu_models.py's device step on this CPU: `run --quick` on a hand-made jobs file, with a
tiny randomly initialised Llama (SmolLM2's tokenizer and chat template) registered under both
Qwen's and SmolLM2's names, in a subprocess that must not import the parts of the stack a
device machine lacks; it scores and writes its results itself. Without --quick and without
CUDA the step is refused. The real weights run through the same `TransformersGenerator` in
tests/test_generation.py; the GPU itself only on a lent device (bench/results/gpu_models.md)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import tiny_smollm2_llama

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "bench/gpu_models.py")


def _row(qid, question, answer, passages, gold):
    return {"id": qid, "question": question, "answers": [answer],
            "contexts": [{"id": f"{qid}-{i}", "title": t, "text": x, "score": 1.0}
                         for i, (t, x) in enumerate(passages)], "gold_positions": gold}


PASSAGES = [("Paris", "Paris is the capital and largest city of France."),
            ("Rome", "Rome is the capital city of Italy.")]


def _cargo(tmp: Path) -> Path:
    cargo = tmp / "cargo"
    cargo.mkdir()
    sets = {name: [_row(f"{name}-1", "What is the capital of France?", "Paris", PASSAGES, [1]),
                   _row(f"{name}-2", "What is the capital of Italy?", "Rome", PASSAGES, [2])]
            for name in ("valid", "test")}
    with gzip.open(cargo / "jobs.json.gz", "wt") as f:
        json.dump({"sets": sets, "extractive": {"test-1": "Paris", "test-2": "Italy"}}, f)
    return cargo


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    from bench.gpu_models import QWEN, SMOL

    tmp = tmp_path_factory.mktemp("gpu")
    tiny_smollm2_llama(tmp / "tiny")
    entry = f"{{kind: generator, format: hf, path: '{tmp / 'tiny'}'}}"
    (tmp / "models.yaml").write_text(f"models:\n  {QWEN}: {entry}\n  {SMOL}: {entry}\n")
    cargo, out = _cargo(tmp), tmp / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAGPILOT_MODELS": str(tmp / "models.yaml"),
           "RAGPILOT_BENCH_RESULTS": str(out), "CUDA_VISIBLE_DEVICES": ""}
    refused = subprocess.run([sys.executable, SCRIPT, "run", "--cargo", str(cargo)],
                             capture_output=True, text=True, env=env, timeout=300)
    proc = subprocess.run([sys.executable, SCRIPT, "run", "--quick", "--cargo", str(cargo)],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return refused, out


def test_without_cuda_the_full_run_is_refused(device_run):
    refused, out = device_run
    assert refused.returncode == 2 and "--quick" in refused.stderr
    assert not (out / "gpu_models.json").exists()


def test_the_quick_run_scores_answers_and_the_judge_and_imports_no_server_stack(device_run):
    _, out = device_run
    res = json.loads((out / "gpu_models.quick.json").read_text())
    assert (out / "gpu_models.quick.md").read_text().startswith("# Packaged models on a lent GPU")
    info = res["meta"]["device_run"]
    assert info["device"] == "cpu" and info["heavy_modules_imported"] == []  # no Ray, tantivy...
    rows = {(r["dataset"], r["system"], r["metric"]): r for r in res["rows"]}
    for system in ("qwen2.5-coder-1.5b", "smollm2-135m"):
        f1 = rows[("hotpotqa/test/hybrid-k5", system, "answer_f1")]
        assert f1["n"] == 2 and 0.0 <= f1["ci_low"] <= f1["value"] <= f1["ci_high"] <= 1.0
        assert rows[("hotpotqa/test/hybrid-k5", system, "gpu_s_per_answer")]["value"] > 0
    for p in ("cite_concise", "plain"):  # Qwen's test prompt is chosen on valid
        assert rows[("hotpotqa/valid/hybrid-k5", f"qwen2.5-coder-1.5b:{p}", "answer_f1")]["n"] == 2
    diff = rows[("hotpotqa/test/hybrid-k5", "qwen2.5-coder-1.5b - smollm2-135m", "answer_f1_diff")]
    assert diff["n"] == 2
    judged = [r for k, r in rows.items() if k[0].startswith("hotpotqa/test/answer-pairs")]
    assert {r["system"] for r in judged} == {"judge:qwen", "judge:qwen+passages"}
    bias = rows[("hotpotqa/test/answer-pairs (gpu logprob)", "judge:qwen", "position_bias")]
    assert bias["n"] >= 2 and 0.0 <= bias["value"] <= 1.0  # Italy vs Rome differ at least
    assert "nomic: not run (no nomic_ref.json in the cargo)" in res["meta"]["notes"]
