"""Configuration of generator adaptation: LoRA SFT, then DPO / IPO / ORPO
(`ragpilot train-generator`).

`GeneratorSFTConfig` is read from the `generator_sft:` mapping of configs/rl/generator_sft.yaml;
every field is bounds-checked at load and an unknown or bad key raises `ConfigError` naming it
(`generator_sft.train.epochz`). The SFT trainer is `rl.adaptation.generator_trainer.SFTRun`, the
preference trainer `rl.adaptation.prefs.train_preferences` (reads the `prefs` group).

Field groups (the YAML keys):
- model: `base_model`, `prompt_id`, `max_len`, `qlora` (alias `load_in_4bit`), `device`,
  `threads`;
- `lora` (`LoraSpec`): the adapter's shape;
- `train` (`TrainSpec`): the SFT optimisation;
- `checkpoint` (`CheckpointSpec`) and `eval` (`EvalSpec`): resume points and the valid-split
  answer F1 that picks the `best` checkpoint;
- `data` (`DataSpec`): where SFT examples come from;
- `prefs` (`PrefSpec`): DPO / IPO / ORPO;
- `mlflow` (`MlflowSpec`): tracking.
"""

from __future__ import annotations

import os
from importlib.resources.abc import Traversable
from typing import Any, Literal

from pydantic import AliasChoices, Field

from rag.errors import ConfigError
from rag.generation.prompts import get_prompt
from rag.resources import default_config
from rag.settings_base import StrictSettings, YamlSource

DEFAULTS_PATH = default_config("rl/generator_sft.yaml")


class LoraSpec(StrictSettings):
    """The LoRA adapter trained over the frozen base."""

    r: int = Field(8, ge=1, le=256)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class TrainSpec(StrictSettings):
    """SFT optimisation (AdamW, linear warm-up then linear decay)."""

    lr: float = Field(3e-4, gt=0.0, lt=1.0)
    epochs: int = Field(1, ge=1, le=100)
    max_steps: int | None = Field(None, ge=1)
    """Overrides `epochs` when set."""
    batch_size: int = Field(4, ge=1, le=256)
    """Examples per optimiser step (run one at a time: no padding)."""
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    seed: int = 0


class CheckpointSpec(StrictSettings):
    every_steps: int = Field(25, ge=1)
    keep: int = Field(2, ge=1)
    """Checkpoints kept besides those `latest` and `best` point at (never deleted)."""


class EvalSpec(StrictSettings):
    """Greedy answers on the valid split; the answer F1 (`eval_f1`, higher is better) picks the
    `best` checkpoint and the registry's `@best`."""

    every_steps: int = Field(50, ge=1)
    n: int = Field(40, ge=0)
    """Examples evaluated (0: no evaluation)."""
    max_new_tokens: int = Field(24, ge=1, le=512)
    batch_size: int = Field(8, ge=1)


class DataSpec(StrictSettings):
    """SFT examples: a HotpotQA train split, plus positive log rows, plus teacher answers."""

    dataset: Literal["hotpotqa"] = "hotpotqa"
    n_train: int = Field(500, ge=1)
    n_distractors: int = Field(1, ge=0, le=8)
    max_context_chars: int = Field(600, ge=50)
    """Per passage, trimmed around the supporting sentences."""
    log_jsonl: str | None = None
    """`ragpilot export-interactions` output to add (rows with reward >= log_min_reward)."""
    log_index: str | None = None
    """Index dir whose corpus.jsonl resolves the log's context ids."""
    log_min_reward: float = Field(0.7, ge=0.0, le=1.0)
    teacher: str | None = None
    """Registry name of an OpenAI-compatible teacher (format openai)."""
    teacher_min_f1: float = Field(0.5, ge=0.0, le=1.0)


class PrefSpec(StrictSettings):
    """DPO / IPO (DPO with loss_type ipo) / ORPO with TRL."""

    beta: float = Field(0.1, gt=0.0)
    lr: float = Field(5e-5, gt=0.0, lt=1.0)
    steps: int = Field(30, ge=1)
    batch_size: int = Field(2, ge=1)
    n_pairs: int = Field(64, ge=1)
    ranker: Literal["auto", "f1", "quality", "judge"] = "auto"
    """auto: the reward model if one is installed, else f1; judge: `judge_model` grading each
    answer against the gold answer (rl.adaptation.prefs.judge_ranker)."""
    judge_model: str = "qwen2.5-coder-1.5b-instruct"
    """The registry generator the `judge` ranker grades with (transformers, on the run's
    device; ~1 s a grade for the 1.5B model on 2 CPU cores)."""
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    """Sampling temperature of the rejected candidates."""


class MlflowSpec(StrictSettings):
    enabled: bool = True
    dir: str = "runs/mlflow"
    experiment: str = "generator_sft"
    register_model: bool = True


class GeneratorSFTConfig(StrictSettings):
    SECTION = "generator_sft"

    # -- model ----------------------------------------------------------------------------------
    base_model: str = "smollm2-135m-instruct"
    """Registry name (GGUF converted once) or a local HF folder."""
    prompt_id: str = "cite_concise"
    """The prompt template the generator is served with."""
    max_len: int = Field(384, ge=32, le=8192)
    """Prompt + answer tokens; longer examples get shorter contexts."""
    qlora: bool = Field(False, validation_alias=AliasChoices("qlora", "load_in_4bit"))
    """bitsandbytes nf4 base (alias load_in_4bit); needs device cuda and a GPU."""
    qlora_gradient_checkpointing: bool = True
    """With `qlora`: recompute activations in the backward pass (peft's default for k-bit
    training). It saves activation memory for extra step time (a second forward pass; not
    measured here); a small model on a large GPU is not memory-bound and can set false."""
    device: Literal["cpu", "cuda"] = "cpu"
    threads: int = Field(1, ge=1, le=64)
    """torch intra-op threads on CPU."""
    # -- groups ---------------------------------------------------------------------------------
    lora: LoraSpec = LoraSpec()
    train: TrainSpec = TrainSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    eval: EvalSpec = EvalSpec()
    data: DataSpec = DataSpec()
    prefs: PrefSpec = PrefSpec()
    mlflow: MlflowSpec = MlflowSpec()

    @classmethod
    def from_dict(cls, data: Any) -> GeneratorSFTConfig:
        """A mapping, bare or as `{generator_sft: {...}}`; errors name `generator_sft.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Any, where: str | None = None,
                     source: YamlSource | None = None) -> GeneratorSFTConfig:
        if isinstance(data, dict) and "qlora" in data and "load_in_4bit" in data:
            raise ConfigError(f"{where or cls.SECTION}.load_in_4bit",
                              "give qlora or load_in_4bit, not both")
        return super().from_mapping(data, where, source)

    def _after_load(self, where: str, source: YamlSource | None) -> GeneratorSFTConfig:
        get_prompt(self.prompt_id)  # unknown prompt -> ConfigError("prompt_id")
        return self

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str] | Traversable = DEFAULTS_PATH
                  ) -> GeneratorSFTConfig:
        return super().from_yaml(path)

    def replace(self, **changes: Any) -> GeneratorSFTConfig:
        """Dotted overrides (`train.lr=1e-4`), validated like the file."""
        data = self.model_dump()
        for key, value in changes.items():
            node = data
            *parents, leaf = key.split(".")
            for part in parents:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"generator_sft.{key}", "unknown key")
                node = node[part]
            node[leaf] = value
        return GeneratorSFTConfig.from_dict(data)
