"""bench/generator_adaptation.py's row logic: paired deltas against the SFT baseline, the
acceptance verdicts with their margins — on synthetic parts, no model."""

from __future__ import annotations

import json

import bench.generator_adaptation as ga
import numpy as np
import pytest


def _part(f1s: dict[str, list[float]]) -> dict:
    n = len(next(iter(f1s.values())))
    return {"split": "test", "n": n, "ids": [str(i) for i in range(n)], "max_new_tokens": 20,
            "systems": {k: {"f1": v, "em": [float(x == 1.0) for x in v],
                            "citation_precision": [1.0] * n, "seconds": float(n),
                            "tokens_out": [6] * n, "train": {}} for k, v in f1s.items()}}


def test_deltas_are_paired_against_sft_and_verdicts_carry_margins():
    rng = np.random.default_rng(0)
    base = rng.random(200)
    part = _part({"smollm2-sft": base.tolist(),
                  "smollm2-grpo": (base + 0.05).tolist(),          # +0.05 on every question
                  "smollm2-distilled": np.clip(base - 0.3, 0, 1).tolist()})
    rows, md = ga.eval_rows(part)
    by = {(r["system"], r["metric"]): r for r in rows}
    d = by[("smollm2-grpo - smollm2-sft", "delta_answer_f1")]
    assert d["value"] == pytest.approx(0.05) and d["ci_low"] == pytest.approx(0.05)
    assert ("smollm2-sft - smollm2-sft", "delta_answer_f1") not in by
    assert any("| smollm2-grpo - smollm2-sft | delta_answer_f1 | +0.050 |" in x for x in md)
    lines = ga.acceptance_lines(rows)
    assert any(x.startswith("- `smollm2-grpo - smollm2-sft` delta_answer_f1 with CI above 0")
               and ": met (+0.050" in x for x in lines)
    distilled = by[("smollm2-distilled", "answer_f1")]["value"]
    assert any(f"missed ({distilled:.3f}" in x and f"margin {distilled - 0.33:+.3f}" in x
               for x in lines)
    assert any("`smollm2-dpo - smollm2-sft` delta_answer_f1: not measured in this file." in x for x in lines)


def test_parallel_evaluations_of_different_labels_keep_each_other(tmp_path):
    f = tmp_path / "eval-test-3.json"
    a, b = _part({"smollm2-sft": [1.0, 0.0, 0.5]}), _part({"smollm2-ipo": [0.0, 0.0, 1.0]})
    # both processes started from an empty file; b writes after a
    ga._merge_system(f, a, "smollm2-sft")
    got = ga._merge_system(f, b, "smollm2-ipo")
    on_disk = json.loads(f.read_text())
    assert set(on_disk["systems"]) == set(got["systems"]) == {"smollm2-sft", "smollm2-ipo"}
    assert on_disk["systems"]["smollm2-sft"]["f1"] == [1.0, 0.0, 0.5]
    other = _part({"smollm2-orpo": [1.0, 1.0]})  # another question set: refused, file kept
    with pytest.raises(SystemExit, match="changed protocol"):
        ga._merge_system(f, other, "smollm2-orpo")
    assert set(json.loads(f.read_text())["systems"]) == {"smollm2-sft", "smollm2-ipo"}


def test_the_prefs_bench_keeps_the_baseline_and_the_preference_methods_only():
    import bench.generator_prefs as gp

    part = _part({"smollm2-distilled": [1.0, 0.0], "smollm2-orpo": [0.0, 1.0],
                  "smollm2-sft": [0.5, 0.5], "smollm2-ipo": [1.0, 1.0]})
    got = gp.method_part(part)
    assert list(got["systems"]) == ["smollm2-sft", "smollm2-ipo", "smollm2-orpo"]
    rows, _ = ga.eval_rows(got)
    deltas = {r["system"]: r["value"] for r in rows if r["metric"] == "delta_answer_f1"}
    assert deltas == pytest.approx({"smollm2-ipo - smollm2-sft": 0.5,
                                    "smollm2-orpo - smollm2-sft": 0.0})
    with pytest.raises(SystemExit, match="no smollm2-sft"):
        gp.method_part(_part({"smollm2-ipo": [1.0]}))
