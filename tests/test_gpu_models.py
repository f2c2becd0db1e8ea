"""bench/gpu_models.py end to end on this CPU: the device step (`run`) on a hand-made jobs file
with a tiny randomly initialised Llama (SmolLM2's tokenizer and chat template) standing in for
both Qwen and SmolLM2, in a subprocess that must not import the parts of the stack a device
machine lacks, then `ingest` of what it wrote. The real weights run through the same
`TransformersGenerator` in tests/test_generation.py; the GPU itself only on a lent device
(bench/results/gpu_models.md)."""

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


def _row(qid, question, answer, passages, gold):
    return {"id": qid, "question": question, "answers": [answer], "type": "bridge",
            "contexts": [{"id": f"{qid}-{i}", "title": t, "text": x, "score": 1.0}
                         for i, (t, x) in enumerate(passages)], "gold_positions": gold}


PASSAGES = [("Paris", "Paris is the capital and largest city of France."),
            ("Rome", "Rome is the capital city of Italy.")]


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    tiny_smollm2_llama(tmp / "tiny")
    (tmp / "models.yaml").write_text(
        f"models:\n  tiny-lm: {{kind: generator, format: hf, path: '{tmp / 'tiny'}'}}\n")
    cargo, out = tmp / "cargo", tmp / "out"
    cargo.mkdir()
    sets = {}
    for name in ("valid-hybrid", "test-hybrid", "train-gold", "train-hybrid"):
        sets[name] = [_row(f"{name}-1", "What is the capital of France?", "Paris", PASSAGES, [1]),
                      _row(f"{name}-2", "What is the capital of Italy?", "Rome", PASSAGES, [2])]
    jobs = {"created": "test", "sets": sets,
            "extractive": {"test-hybrid": {"test-hybrid-1": "Paris", "test-hybrid-2": "Italy"}}}
    with gzip.open(cargo / "jobs.json.gz", "wt") as f:
        json.dump(jobs, f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAGPILOT_MODELS": str(tmp / "models.yaml")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/gpu_models.py"), "run", "--device", "cpu",
         "--qwen", "tiny-lm", "--smol", "tiny-lm", "--only", "qwen", "smollm2", "judge",
         "--cargo", str(cargo), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cargo, out, json.loads((out / "run.json").read_text())


def test_the_device_step_answers_judges_and_imports_no_server_stack(device_run):
    _, out, info = device_run
    assert info["errors"] == []
    assert info["heavy_modules_imported"] == []  # no Ray, tantivy, FAISS or MLflow there
    assert info["qwen_prompt"]["chosen"] in ("cite_concise", "plain")
    with gzip.open(out / "answers.json.gz", "rt") as f:
        answers = json.load(f)
    # 2 prompts on valid, test (+ cite_concise when plain won), 2 train modes; SmolLM2: test,
    # and 3 answers (greedy, 2 samples) per train question in 2 modes
    smol = [a for a in answers if a["model"] == "smollm2"]
    assert len(smol) == 2 + 2 * 2 * 3
    assert {a["tag"] for a in smol} == {"greedy", "s1", "s2"}
    assert all(a["tokens_in"] > 0 for a in answers)
    with gzip.open(out / "judge.json.gz", "rt") as f:
        judge = json.load(f)
    assert judge, "no pair was judged"
    for j in judge:
        assert j["forward"] in ("A", "B", "tie") and j["backward"] in ("A", "B", "tie")
        assert j["winner"] == (j["forward"] if j["forward"] == j["backward"] else "tie")
    assert {j["with_contexts"] for j in judge if j["set"] == "test-hybrid"} == {True, False}


def test_ingest_scores_the_run_and_writes_teacher_records_and_pairs(device_run, tmp_path,
                                                                    monkeypatch):
    import bench.common
    from bench.gpu_models_ingest import ingest

    from rl.adaptation.teacher import TeacherStore

    cargo, out, _ = device_run
    monkeypatch.setattr(bench.common, "RESULTS", tmp_path / "results")
    ingest(cargo, out, tmp_path / "notes", tmp_path / "teacher.sqlite")
    res = json.loads((tmp_path / "results/gpu_models.json").read_text())
    rows = {(r["dataset"], r["system"], r["metric"]): r for r in res["rows"]}
    f1 = rows[("hotpotqa/test/hybrid-k5", "qwen2.5-coder-1.5b", "answer_f1")]
    assert f1["n"] == 2 and 0.0 <= f1["value"] <= 1.0
    assert ("hotpotqa/train[:2]/gold", "teacher:qwen", "kept") in rows
    assert len(TeacherStore(tmp_path / "teacher.sqlite")) == 4  # 2 questions x 2 modes
    for mode in ("gold", "hybrid"):
        pairs = (tmp_path / f"notes/dpo_pairs_{mode}.jsonl").read_text().splitlines()
        for p in map(json.loads, pairs):
            assert p["ranker"] == "judge:qwen" and p["chosen"] != p["rejected"]
            assert p["prompt"].rstrip().endswith("assistant")  # SmolLM2's chat template
