"""GRPO of the generator (rl.adaptation.grpo): the reward's contract, settings bounds, and a tiny
real run (SmolLM2-135M from its packaged weights, 2 steps on 4 HotpotQA train prompts) that
saves an adapter, a merged model and a log, and resumes instead of retraining."""

from __future__ import annotations

import json

import pytest
from tests.conftest import require_dataset

from rag.errors import ConfigError
from rl.adaptation.grpo import GRPOSettings, answer_reward, make_reward_fn


def test_reward_is_f1_plus_weighted_citation_precision():
    assert answer_reward("Paris [1]", ["Paris"], [1], 3, "Capital?") == pytest.approx(1.5)
    assert answer_reward("Paris [2]", ["Paris"], [1], 3, "Capital?") == pytest.approx(1.0)
    assert answer_reward("Lyon [1][2]", ["Paris"], [1], 3, "Capital?", 1.0) == 0.5
    assert answer_reward("Paris", ["Paris"], [1], 3, "Capital?") == 1.0   # cites nothing
    fn = make_reward_fn(GRPOSettings(rm_weight=1.0), lambda qs, ts: [0.25] * len(ts))
    r = fn(["p", "p"], ["Paris [1]", "x"], answers=[["Paris"]] * 2, gold_positions=[[1]] * 2,
           n_ctx=[2, 2], question=["Capital?"] * 2)
    assert r == pytest.approx([1.75, 0.25])


def test_settings_bounds():
    with pytest.raises(ConfigError, match="num_generations"):
        GRPOSettings(num_generations=1)
    with pytest.raises(ConfigError, match="beta"):
        GRPOSettings(beta=-0.1)
    with pytest.raises(ConfigError):
        GRPOSettings(prompt_id="nope")
    with pytest.raises(ConfigError, match="max_seconds"):
        GRPOSettings(max_seconds=-1)
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        GRPOSettings(keep_checkpoints=0)
    with pytest.raises(ConfigError, match="micro_batch"):
        GRPOSettings(prompts_per_step=2, num_generations=4, micro_batch=3)
    assert GRPOSettings(prompts_per_step=2, num_generations=4, micro_batch=4).micro_batch == 4


def test_wall_clock_callback_stops_and_saves_only_after_its_budget():
    from transformers import TrainerControl, TrainerState

    from rl.adaptation.grpo import wall_clock_callback

    state, control = TrainerState(), TrainerControl()
    state.global_step = 3
    late = wall_clock_callback(3600.0)
    late.on_train_begin(None, state, control)
    late.on_step_end(None, state, control)
    assert not control.should_training_stop and not control.should_save
    assert late.fired_at is None
    now = wall_clock_callback(1e-9)
    now.on_step_end(None, state, control)          # before on_train_begin: no clock yet
    assert not control.should_training_stop
    now.on_train_begin(None, state, control)
    now.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save and now.fired_at == 3


@pytest.mark.slow
def test_two_grpo_steps_then_resume(tmp_path):
    require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl")
    from rl.adaptation.generator_model import resolve_base
    from rl.adaptation.grpo import run_grpo
    from rl.adaptation.sft_data import hotpot_split

    s = GRPOSettings(n_train=4, steps=2, prompts_per_step=1, num_generations=2,
                     max_completion_length=6, save_steps=2, eval_n=0)
    ex = hotpot_split("train", 4, n_distractors=0, max_context_chars=150)
    policy = resolve_base("smollm2-135m-instruct")
    out = run_grpo(policy, tmp_path / "g", s, ex, merge=False)
    assert out["steps_done"] == 2 and out["reward_first"] is not None
    assert (tmp_path / "g" / "adapter" / "adapter_config.json").exists()
    meta = json.loads((tmp_path / "g" / "adapter" / "meta.json").read_text())
    assert meta["method"] == "grpo" and meta["settings"]["beta"] == s.beta
    rows = [json.loads(x) for x in (tmp_path / "g" / "train_log.jsonl").read_text().splitlines()]
    assert any("kl" in r for r in rows)
    again = run_grpo(policy, tmp_path / "g", s, ex, merge=False)   # resumes at step 2: no work
    assert again["resumed_from"] and again["steps_done"] == 2
    # a wall-clock budget ends the run after its first step, with a checkpoint there
    # (and micro-batches: the step's 2 samples generated once, the gradient accumulated over 2)
    cut = run_grpo(policy, tmp_path / "c", s.replace(steps=3, max_seconds=1e-6, micro_batch=1),
                   ex, merge=False)
    assert cut["steps_done"] == 1 and cut["stopped_by_clock_at"] == 1
    assert (tmp_path / "c" / "trainer" / "checkpoint-1" / "adapter_model.safetensors").exists()


def test_cli_grpo_refuses_bad_input(tmp_path, capsys):
    from serving.cli import main

    assert main(["train-generator", "grpo", "--out", str(tmp_path / "o")]) == 2  # no --model
    assert "--model" in capsys.readouterr().err
    assert main(["train-generator", "grpo", "--out", str(tmp_path / "o"), "--model",
                 str(tmp_path), "--grpo-set", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
