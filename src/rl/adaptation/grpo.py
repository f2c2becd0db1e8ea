"""Online RL of the generator: TRL `GRPOTrainer` on HotpotQA train questions, starting from an
SFT policy (a merged HF folder, e.g. `ragpilot train-generator sft`'s `<out>/merged`).

Contract:
  policy   the SFT model; a fresh LoRA (r, alpha on q/k/v/o) is trained on top of it, so the
           reference model of the KL term (TRL: the same network with the adapter disabled) *is*
           the SFT policy, at no extra memory.
  prompts  exactly the served prompt (`generator_model.render_prompt`: chat template +
           `cite_concise`) over gold paragraphs (+ `n_distractors`), train split only.
  reward   per completion, in [0, 1 + cite_weight]: answer F1 against gold (HotpotQA
           definition) + `cite_weight` * citation precision against the gold passages (0 when
           nothing is cited), + `rm_weight` * a reward model's score when one is given
           (`extra_reward(questions, answers) -> [0, 1]`).
  loss     GRPO (group-relative advantages over `num_generations` samples of a prompt),
           KL coefficient `beta` to the SFT policy.
  output   <out>/trainer (TRL checkpoints: re-running the same call resumes), <out>/adapter
           (LoRA + meta.json with base_path and the valid-split eval), <out>/merged (plain HF
           folder, `format: hf` generator), `train_log.jsonl` (TRL's logged rows).

`run_grpo(policy, out, settings)` is the whole job: a Ray job entry point runs it as is
(`ray job submit -- ragpilot train-generator grpo --policy ... --out ...`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.metrics.qa import best_em_f1
from rl.adaptation.sft_data import SFTExample


@dataclass(frozen=True)
class GRPOSettings:
    """GRPO run settings; bounds checked at construction (ConfigError names the field)."""

    n_train: int = 200            # HotpotQA train questions (prompts)
    n_distractors: int = 1
    max_context_chars: int = 400  # per passage: prompt tokens are the CPU cost
    steps: int = 80               # optimiser steps
    prompts_per_step: int = 2
    num_generations: int = 4      # samples per prompt (the GRPO group)
    micro_batch: int = 0          # completions per forward/backward (0: the whole step's
    #                               prompts_per_step * num_generations); the step's samples are
    #                               generated once and its gradient accumulated over micro-batches
    max_completion_length: int = 16
    temperature: float = 0.9
    beta: float = 0.04            # KL coefficient to the SFT policy
    lr: float = 2e-5
    lora_r: int = 8
    lora_alpha: int = 16
    cite_weight: float = 0.5
    rm_weight: float = 0.0
    save_steps: int = 20
    keep_checkpoints: int = 2     # TRL checkpoints kept under <out>/trainer (oldest deleted)
    max_seconds: float = 0.0      # wall-clock budget of the training loop (0: none); a run
    #                               stopped by it saves a checkpoint at the step it reached
    eval_n: int = 16              # valid questions for meta eval_f1 (the registry's @best)
    seed: int = 0
    prompt_id: str = "cite_concise"
    precision: str = "auto"       # "auto": bf16 weights and autocast on a CUDA GPU with bf16,
    #                               else fp32; "fp32": fp32 everywhere (an H200 run with bf16
    #                               weights reached a NaN gradient at step 46, lr 1e-4)

    def __post_init__(self):
        for name in ("n_train", "steps", "prompts_per_step", "max_completion_length",
                     "lora_r", "lora_alpha", "save_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"grpo.{name}", "must be >= 1")
        if self.num_generations < 2:
            raise ConfigError("grpo.num_generations", "GRPO needs >= 2 samples per prompt")
        for name in ("beta", "cite_weight", "rm_weight", "n_distractors", "eval_n",
                     "max_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"grpo.{name}", "must be >= 0")
        bs = self.prompts_per_step * self.num_generations
        if self.micro_batch < 0 or (self.micro_batch and bs % self.micro_batch):
            raise ConfigError("grpo.micro_batch", f"must divide prompts_per_step * "
                                                  f"num_generations = {bs} (0: all of it)")
        if not 0 < self.temperature <= 2 or not 0 < self.lr < 1:
            raise ConfigError("grpo.temperature/lr", "temperature in (0, 2], lr in (0, 1)")
        if self.precision not in ("auto", "fp32"):
            raise ConfigError("grpo.precision", f"auto or fp32, got {self.precision!r}")
        get_prompt(self.prompt_id)

    def replace(self, **changes: Any) -> GRPOSettings:
        return GRPOSettings(**{**asdict(self), **changes})


def answer_reward(completion: str, answers: Sequence[str], gold_positions: Sequence[int],
                  n_contexts: int, question: str, cite_weight: float = 0.5,
                  prompt_id: str = "cite_concise") -> float:
    """F1(parsed answer, gold) + cite_weight * precision(cited passages vs gold positions)."""
    tpl = get_prompt(prompt_id)
    text, cites = parse_output(completion, n_contexts, tpl.concise, question)
    f1 = best_em_f1(text, list(answers))[1] if answers else 0.0
    gold = set(gold_positions)
    prec = len(set(cites) & gold) / len(set(cites)) if cites else 0.0
    return float(f1 + cite_weight * prec)


def make_reward_fn(settings: GRPOSettings,
                   extra_reward: Callable[[list[str], list[str]], list[float]] | None = None):
    """The TRL reward function: (prompts, completions, dataset columns) -> list[float]."""
    def reward(prompts, completions, answers, gold_positions, n_ctx, question, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        r = [answer_reward(t, a, g, n, q, settings.cite_weight, settings.prompt_id)
             for t, a, g, n, q in zip(texts, answers, gold_positions, n_ctx, question,
                                      strict=True)]
        if extra_reward is not None and settings.rm_weight > 0:
            extra = extra_reward(list(question), texts)
            r = [x + settings.rm_weight * y for x, y in zip(r, extra, strict=True)]
        return r
    reward.__name__ = "answer_f1_citation"
    return reward


def grpo_dataset(tokenizer, examples: Sequence[SFTExample], prompt_id: str):
    """A `datasets.Dataset` of served prompts plus the columns the reward reads."""
    from datasets import Dataset

    from rl.adaptation.generator_model import render_prompt

    return Dataset.from_list([{
        "prompt": render_prompt(tokenizer, e.question, e.contexts, prompt_id),
        "question": e.question, "answers": list(e.answers),
        "gold_positions": list(e.gold_positions), "n_ctx": len(e.contexts)} for e in examples])


def wall_clock_callback(seconds: float):
    """A TRL/HF `TrainerCallback` that ends training (with a checkpoint) once `seconds` of
    wall clock have passed since `on_train_begin`: a GPU lease or a batch slot is a time
    budget, and a run cut by the scheduler instead would lose everything after the last save."""
    import time

    from transformers import TrainerCallback

    class WallClock(TrainerCallback):
        def __init__(self):
            self.t0: float | None = None
            self.fired_at: int | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if self.t0 is not None and time.perf_counter() - self.t0 >= seconds:
                control.should_training_stop = True
                control.should_save = True
                self.fired_at = state.global_step
            return control

    return WallClock()


def _last_checkpoint(trainer_dir: Path) -> str | None:
    cks = sorted(trainer_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(cks[-1]) if cks else None


def _cuda_bf16() -> bool:
    """bf16 (mixed precision, and the policy's weights) where a CUDA GPU supports it; never on
    CPU, where a CPU without bf16 instructions runs bf16 matmuls on a scalar kernel
    (`rl.adaptation.prefs`). Returns False without CUDA. Measurements: docs/design-notes.md."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def run_grpo(policy: str | Path, out: str | Path, settings: GRPOSettings | None = None,
             examples: Sequence[SFTExample] | None = None,
             eval_examples: Sequence[SFTExample] | None = None,
             extra_reward=None, merge: bool = True) -> dict[str, Any]:
    """Train (or resume) GRPO from `policy`; returns a summary (steps, seconds, reward first/
    last logged, eval) and writes the artifacts of the module docstring."""
    import time

    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from rl.adaptation.generator_config import GeneratorSFTConfig
    from rl.adaptation.generator_model import eval_f1, load_tokenizer
    from rl.adaptation.sft_data import hotpot_split

    s = settings or GRPOSettings()
    policy, out = Path(policy), Path(out)
    if not (policy / "config.json").exists():
        raise ConfigError("--policy", f"no HF model folder at {policy} (a merged SFT run)")
    torch.manual_seed(s.seed)
    if examples is None:
        examples = hotpot_split("train", s.n_train, n_distractors=s.n_distractors,
                                max_context_chars=s.max_context_chars, seed=s.seed)
    tok = load_tokenizer(policy)
    ds = grpo_dataset(tok, examples, s.prompt_id)
    bs = s.prompts_per_step * s.num_generations
    micro = s.micro_batch or bs
    bf16 = s.precision == "auto" and _cuda_bf16()
    args = GRPOConfig(
        # TRL generates per_device_train_batch_size * gradient_accumulation_steps completions
        # per optimiser step (steps_per_generation defaults to the accumulation steps)
        output_dir=str(out / "trainer"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=bs // micro, num_generations=s.num_generations,
        max_completion_length=s.max_completion_length, temperature=s.temperature,
        beta=s.beta, learning_rate=s.lr, max_steps=s.steps, logging_steps=1,
        save_steps=s.save_steps, save_total_limit=s.keep_checkpoints, seed=s.seed, use_cpu=not
        torch.cuda.is_available(), report_to=[], bf16=bf16, disable_dropout=True,
        dataloader_num_workers=0, shuffle_dataset=True,
        # TRL turns checkpointing on by default; on CPU with a 135M model it only makes the
        # sampling slower (no KV cache reuse) and memory is not the limit
        gradient_checkpointing=False,
        # on CUDA the policy's weights load in bf16 (TRL's default is fp32): half the memory
        # and traffic for the sampling and the reference pass; the LoRA weights stay fp32
        model_init_kwargs={"dtype": "bfloat16"} if bf16 else None)
    lora = LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    clock = wall_clock_callback(s.max_seconds) if s.max_seconds > 0 else None
    trainer = GRPOTrainer(model=str(policy), reward_funcs=make_reward_fn(s, extra_reward),
                          args=args, train_dataset=ds, processing_class=tok, peft_config=lora,
                          callbacks=[clock] if clock else None)
    t0 = time.perf_counter()
    resume = _last_checkpoint(out / "trainer")
    if resume and int(resume.rsplit("-", 1)[-1]) >= s.steps:
        # done already (or stopped by hand at a checkpoint and finalised with steps=N):
        # HF's resume would still run one more step, so read the adapter back instead
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(trainer.model,
                                  load_file(str(Path(resume) / "adapter_model.safetensors")))
        trainer.state = trainer.state.load_from_json(str(Path(resume) / "trainer_state.json"))
        train_loss = float("nan")
    else:
        train_loss = float(trainer.train(resume_from_checkpoint=resume).training_loss)
    seconds = time.perf_counter() - t0
    log = [r for r in trainer.state.log_history if "reward" in r]
    (out / "trainer").mkdir(parents=True, exist_ok=True)
    with (out / "train_log.jsonl").open("w") as f:
        for r in trainer.state.log_history:
            f.write(json.dumps(r) + "\n")
    adapter = out / "adapter"
    trainer.model.save_pretrained(str(adapter))
    ev: dict[str, float] = {}
    if s.eval_n:
        ev_examples = list(eval_examples) if eval_examples is not None else \
            hotpot_split("valid", s.eval_n)
        ev = eval_f1(trainer.model, tok, ev_examples,
                     GeneratorSFTConfig().replace(prompt_id=s.prompt_id))
    summary = {"method": "grpo", "base_path": str(policy.resolve()), "settings": asdict(s),
               "steps_done": int(trainer.state.global_step), "seconds": seconds,
               "resumed_from": resume, "train_loss": train_loss,
               "stopped_by_clock_at": clock.fired_at if clock else None,
               "reward_first": log[0]["reward"] if log else None,
               "reward_last": log[-1]["reward"] if log else None,
               "reward_mean_last10": (sum(r["reward"] for r in log[-10:]) / len(log[-10:])
                                      if log else None),
               "eval": ev}
    (adapter / "meta.json").write_text(json.dumps(summary, indent=1, default=str))
    if merge:
        from rl.adaptation.generator_export import merge_adapter

        summary["merged"] = str(merge_adapter(adapter, out / "merged", base_path=policy))
    return summary


def settings_from_env(**overrides: Any) -> GRPOSettings:
    """Defaults, then `overrides` (None values ignored); threads from OMP_NUM_THREADS."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return GRPOSettings().replace(**{k: v for k, v in overrides.items() if v is not None})
