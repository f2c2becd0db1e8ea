"""LoRA SFT of the generator (peft, plain torch loop) with exact checkpoint/resume.

Why a plain loop instead of TRL's SFTTrainer: a run killed at any moment must resume and end where
an uninterrupted run ends. Everything that decides the next step is in the checkpoint: LoRA
weights, AdamW and LR-schedule state, the python/torch RNG states and the step; the data order is a
pure function of (seed, epoch), so batch k is the same batch whatever happened before. Checkpoints
are written to a temporary folder and renamed (a kill mid-write leaves the previous one intact);
`latest` and `best` (by valid-split answer F1) are symlinks swapped atomically, and the same
aliases go to MLflow: run tags `alias.latest` / `alias.best`, and a registered model per run whose
versions are the checkpoints, with aliases `best` and `newest` (MLflow reserves the name
`latest`: `models:/<name>/latest` is built in and resolves to the newest version).

Examples run one at a time (no padding: CPU cost is linear in real tokens); `batch_size` of them
make one optimiser step, the loss being the mean over all answer tokens of the batch. Only the
answer tokens (`<answer> [i][j]` + end of turn) carry loss. QLoRA (`qlora: true`): the frozen
base is loaded in bitsandbytes nf4 — same code, same config file — and refused without a GPU.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, Field

from rag.errors import ConfigError
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.metrics.qa import best_em_f1
from rag.resources import default_config
from rag.settings_base import StrictSettings, YamlSource
from rl.adaptation.sft_data import SFTExample, examples_manifest

DEFAULTS_PATH = default_config("rl/generator_sft.yaml")
CKPT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"

# --------------------------------------------------------------------------- config


class LoraSpec(StrictSettings):
    r: int = Field(8, ge=1, le=256)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class TrainSpec(StrictSettings):
    lr: float = Field(3e-4, gt=0.0, lt=1.0)
    epochs: int = Field(1, ge=1, le=100)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(4, ge=1, le=256)
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    seed: int = 0


class CheckpointSpec(StrictSettings):
    every_steps: int = Field(25, ge=1)
    keep: int = Field(2, ge=1)


class EvalSpec(StrictSettings):
    every_steps: int = Field(50, ge=1)
    n: int = Field(40, ge=0)
    max_new_tokens: int = Field(24, ge=1, le=512)
    batch_size: int = Field(8, ge=1)


class DataSpec(StrictSettings):
    dataset: Literal["hotpotqa"] = "hotpotqa"
    n_train: int = Field(500, ge=1)
    n_distractors: int = Field(1, ge=0, le=8)
    max_context_chars: int = Field(600, ge=50)
    log_jsonl: str | None = None
    log_index: str | None = None
    log_min_reward: float = Field(0.7, ge=0.0, le=1.0)
    teacher: str | None = None
    teacher_min_f1: float = Field(0.5, ge=0.0, le=1.0)


class PrefSpec(StrictSettings):
    beta: float = Field(0.1, gt=0.0)
    lr: float = Field(5e-5, gt=0.0, lt=1.0)
    steps: int = Field(30, ge=1)
    batch_size: int = Field(2, ge=1)
    n_pairs: int = Field(64, ge=1)
    ranker: Literal["auto", "f1", "quality"] = "auto"
    temperature: float = Field(0.8, ge=0.0, le=2.0)


class MlflowSpec(StrictSettings):
    enabled: bool = True
    dir: str = "runs/mlflow"
    experiment: str = "generator_sft"
    register_model: bool = True


class GeneratorSFTConfig(StrictSettings):
    SECTION = "generator_sft"

    base_model: str = "smollm2-135m-instruct"
    prompt_id: str = "cite_concise"
    max_len: int = Field(384, ge=32, le=8192)
    qlora: bool = Field(False, validation_alias=AliasChoices("qlora", "load_in_4bit"))
    device: Literal["cpu", "cuda"] = "cpu"
    threads: int = Field(1, ge=1, le=64)
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


# --------------------------------------------------------------------------- model


def resolve_base(name_or_path: str) -> Path:
    """A local HF folder as is; else a registry generator (GGUF converted once to the cache)."""
    p = Path(os.path.expanduser(name_or_path))
    if (p / "config.json").exists():
        return p
    from rag.generation.local import ensure_converted

    return ensure_converted(name_or_path)


def check_qlora(cfg: GeneratorSFTConfig) -> None:
    """QLoRA needs a CUDA GPU (bitsandbytes nf4 kernels): a typed error naming the key."""
    if not cfg.qlora:
        return
    import torch

    if cfg.device != "cuda" or not torch.cuda.is_available():
        raise ConfigError("generator_sft.qlora", "QLoRA (bitsandbytes nf4, alias load_in_4bit) "
                                                 "needs device: cuda and a visible CUDA GPU; set "
                                                 "qlora: false on CPU")


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(path: str | Path, cfg: GeneratorSFTConfig):
    """The frozen base: fp32 on CPU, bf16 on CUDA, nf4 with `qlora`."""
    import torch
    from transformers import AutoModelForCausalLM

    check_qlora(cfg)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("generator_sft.device", "cuda requested but no GPU is visible")
    kwargs: dict[str, Any] = {}
    if cfg.qlora:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True)
        kwargs["device_map"] = {"": 0}
    elif cfg.device == "cuda":
        kwargs["dtype"] = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if cfg.qlora:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model)
    elif cfg.device == "cuda":
        model.to("cuda")
    return model


def add_lora(model, cfg: GeneratorSFTConfig):
    from peft import LoraConfig, get_peft_model

    lc = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                    target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lc)


# --------------------------------------------------------------------------- data encoding


def render_prompt(tokenizer, question: str, contexts, prompt_id: str) -> str:
    """Exactly the prompt `rag.generation.local.TransformersGenerator` serves with."""
    tpl = get_prompt(prompt_id)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(tpl.messages(question, list(contexts)),
                                             tokenize=False, add_generation_prompt=True)
    return tpl.text(question, list(contexts)) + " "


def end_of_turn(tokenizer) -> str:
    """What closes an assistant answer: the chat template's end-of-turn (= eos for SmolLM2)."""
    return tokenizer.eos_token or ""


def encode_example(tokenizer, ex: SFTExample, prompt_id: str, max_len: int
                   ) -> tuple[list[int], list[int]] | None:
    """(input_ids, labels) with -100 on the prompt; contexts shrink (x0.7) until the example fits
    `max_len`; None when even 100-char contexts do not fit."""
    from rag.types import Context

    ctxs = list(ex.contexts)
    target = ex.target + end_of_turn(tokenizer)
    t_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
    chars = max((len(c.text) for c in ctxs), default=0)
    for _ in range(12):
        p_ids = tokenizer(render_prompt(tokenizer, ex.question, ctxs, prompt_id),
                          add_special_tokens=False)["input_ids"]
        if len(p_ids) + len(t_ids) <= max_len:
            return p_ids + t_ids, [-100] * len(p_ids) + t_ids
        chars = int(chars * 0.7)
        if chars < 100:
            return None
        ctxs = [Context(c.id, c.title, c.text[:chars], c.score) for c in ctxs]
    return None


# --------------------------------------------------------------------------- generation/eval


def generate_answers(model, tokenizer, questions: Sequence[str], contexts_list, prompt_id: str,
                     max_new_tokens: int = 24, batch_size: int = 8, temperature: float = 0.0
                     ) -> list[dict[str, Any]]:
    """Greedy (or sampled) answers parsed like the served generator: text, citations, raw,
    tokens_out. Left-padded batches."""
    import torch

    tpl = get_prompt(prompt_id)
    prompts = [render_prompt(tokenizer, q, c, prompt_id)
               for q, c in zip(questions, contexts_list, strict=True)]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[dict[str, Any]] = []
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[s:s + batch_size], return_tensors="pt", padding=True,
                            add_special_tokens=False, return_token_type_ids=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.inference_mode():
                gen = model.generate(**enc, max_new_tokens=max_new_tokens,
                                     do_sample=temperature > 0,
                                     temperature=temperature if temperature > 0 else None,
                                     top_p=None, top_k=None,
                                     pad_token_id=tokenizer.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            for j in range(new.shape[0]):
                i = s + j
                ids = [t for t in new[j].tolist() if t != tokenizer.pad_token_id]
                raw = tokenizer.decode(ids, skip_special_tokens=True)
                text, cites = parse_output(raw, len(contexts_list[i]), tpl.concise, questions[i])
                out.append({"text": text, "citations": list(cites if tpl.cites else ()),
                            "raw": raw, "tokens_out": len(ids)})
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    return out


def eval_f1(model, tokenizer, examples: Sequence[SFTExample], cfg: GeneratorSFTConfig
            ) -> dict[str, float]:
    """Answer EM/F1 (HotpotQA definitions) and citation hit rate of greedy answers."""
    if not examples:
        return {}
    gens = generate_answers(model, tokenizer, [e.question for e in examples],
                            [list(e.contexts) for e in examples], cfg.prompt_id,
                            cfg.eval.max_new_tokens, cfg.eval.batch_size)
    em = f1 = cite = 0.0
    for e, g in zip(examples, gens, strict=True):
        a, b, _, _ = best_em_f1(g["text"], e.answers)
        em, f1 = em + a, f1 + b
        gold = set(e.gold_positions)
        cited = set(g["citations"])
        cite += len(cited & gold) / len(cited) if cited else 0.0
    n = len(examples)
    return {"eval_em": em / n, "eval_f1": f1 / n, "eval_citation_precision": cite / n,
            "eval_n": float(n)}


# --------------------------------------------------------------------------- checkpoints


def _atomic_symlink(target: str, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def alias_path(out_dir: str | Path, alias: Literal["latest", "best"]) -> Path | None:
    """The checkpoint folder an alias points at (None before the first one)."""
    link = Path(out_dir) / CKPT_DIR / alias
    return link.resolve() if link.is_symlink() and link.resolve().exists() else None


def _rng_state() -> dict[str, Any]:
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def _schedule(cfg: GeneratorSFTConfig, total: int) -> Callable[[int], float]:
    warm = cfg.train.warmup_steps

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / (warm + 1)
        return max(0.0, (total - step) / max(1, total - warm))

    return f


class SFTRun:
    """One training run in `out_dir`: checkpoints/, metrics.jsonl, meta.json, mlflow run.

    `train()` resumes from `checkpoints/latest` when present. `stop_after` (steps done in this
    call) lets tests stop a run mid-way, like a kill after a checkpoint. `data_manifest`: the
    dataset manifest of the training examples (default `examples_manifest(train_examples)`),
    written to `<out>/dataset_manifest.json` and, with `rag.provenance.provenance_tags`, to the
    MLflow run's tags (code commit, dataset, manifest sha256, input files' sha256)."""

    def __init__(self, cfg: GeneratorSFTConfig, out_dir: str | Path,
                 train_examples: Sequence[SFTExample], eval_examples: Sequence[SFTExample] = (),
                 base_path: str | Path | None = None, mlflow_uri: str | None = None,
                 log: Callable[[str], None] = print,
                 data_manifest: Mapping[str, Any] | None = None):
        if not train_examples:
            raise ConfigError("generator_sft.data", "no training examples")
        self.cfg, self.out = cfg, Path(out_dir)
        self.train_examples, self.eval_examples = list(train_examples), list(eval_examples)
        self.base_path = Path(base_path) if base_path else resolve_base(cfg.base_model)
        self.mlflow_uri = mlflow_uri
        self.log = log
        self.ckpt_root = self.out / CKPT_DIR
        self.data_manifest = dict(data_manifest) if data_manifest is not None else \
            examples_manifest(self.train_examples)

    # -- helpers ----------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.train_examples) / self.cfg.train.batch_size)

    def total_steps(self) -> int:
        return self.cfg.train.max_steps or self.cfg.train.epochs * self.steps_per_epoch()

    def batch_indices(self, step: int) -> list[int]:
        """Examples of optimiser step `step` (0-based): a pure function of (seed, epoch)."""
        spe, bs = self.steps_per_epoch(), self.cfg.train.batch_size
        epoch, k = divmod(step, spe)
        order = list(range(len(self.train_examples)))
        random.Random(self.cfg.train.seed * 1_000_003 + epoch).shuffle(order)
        return order[k * bs:(k + 1) * bs]

    def meta(self) -> dict[str, Any]:
        c = self.cfg
        return {"base_model": c.base_model, "base_path": str(self.base_path),
                "lora_r": c.lora.r, "lora_alpha": c.lora.alpha,
                "target_modules": list(c.lora.target_modules), "max_len": c.max_len,
                "prompt_id": c.prompt_id, "qlora": c.qlora, "lr": c.train.lr,
                "batch_size": c.train.batch_size, "total_steps": self.total_steps(),
                "n_train": len(self.train_examples), "n_eval": len(self.eval_examples),
                "seed": c.train.seed}

    # -- main loop --------------------------------------------------------------------------
    def train(self, stop_after: int | None = None) -> dict[str, Any]:
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        cfg = self.cfg
        if cfg.device == "cpu":
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_root.mkdir(exist_ok=True)
        (self.out / "dataset_manifest.json").write_text(
            json.dumps(self.data_manifest, indent=1, sort_keys=True, default=str) + "\n")
        tok = load_tokenizer(self.base_path)
        model = add_lora(load_base_model(self.base_path, cfg), cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        total = self.total_steps()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(cfg, total))
        encoded = [encode_example(tok, e, cfg.prompt_id, cfg.max_len)
                   for e in self.train_examples]
        skipped = sum(x is None for x in encoded)

        state: dict[str, Any] = {"step": 0, "best_f1": -1.0, "best_step": None,
                                 "tokens": 0, "train_seconds": 0.0, "mlflow_run_id": None,
                                 "history": []}
        resumed_from = None
        latest = alias_path(self.out, "latest")
        if latest is not None:
            ck = torch.load(latest / STATE_FILE, weights_only=False)
            set_peft_model_state_dict(model, load_file(str(latest / "adapter_model.safetensors")))
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            state = ck["state"]
            _set_rng_state(ck["rng"])
            resumed_from = state["step"]
            self.log(f"[sft] resumed from {latest.name} (step {state['step']}/{total})")
        tracker = _Tracker(self, state) if cfg.mlflow.enabled else None
        model.train()
        done_here = 0
        while state["step"] < total:
            if stop_after is not None and done_here >= stop_after:
                break
            step = state["step"]
            batch = [encoded[i] for i in self.batch_indices(step) if encoded[i] is not None]
            n_target = sum(sum(t != -100 for t in lab) for _, lab in batch) or 1
            t0 = time.perf_counter()
            loss_sum = 0.0
            for ids, lab in batch:
                x = torch.tensor([ids], device=model.device)
                y = torch.tensor([lab], device=model.device)
                logits = model(input_ids=x).logits[:, :-1].float()
                tok_loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1),
                    ignore_index=-100, reduction="sum")
                (tok_loss / n_target).backward()
                loss_sum += float(tok_loss.detach())
                state["tokens"] += len(ids)
            torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            state["train_seconds"] += time.perf_counter() - t0
            state["step"] = step + 1
            done_here += 1
            rec = {"step": state["step"], "loss": loss_sum / n_target,
                   "lr": sched.get_last_lr()[0],
                   "tokens_per_s": state["tokens"] / max(state["train_seconds"], 1e-9)}
            state["history"].append(rec)
            if tracker:
                tracker.metrics(rec, state["step"])
            last = state["step"] == total
            if self.eval_examples and (state["step"] % cfg.eval.every_steps == 0 or last):
                ev = eval_f1(model, tok, self.eval_examples[:cfg.eval.n] if cfg.eval.n else [],
                             cfg)
                rec.update(ev)
                if tracker and ev:
                    tracker.metrics(ev, state["step"])
                if ev and ev["eval_f1"] > state["best_f1"]:
                    state["best_f1"], state["best_step"] = ev["eval_f1"], state["step"]
                    self._save(model, opt, sched, state, tok, best=True, tracker=tracker,
                               eval_row=ev)
                self.log(f"[sft] step {state['step']}/{total} loss {rec['loss']:.4f} "
                         + " ".join(f"{k} {v:.3f}" for k, v in ev.items()))
            if state["step"] % cfg.checkpoint.every_steps == 0 or last:
                self._save(model, opt, sched, state, tok, best=False, tracker=tracker)
        summary = {**self.meta(), "steps_done": state["step"], "resumed_from": resumed_from,
                   "skipped_examples": skipped, "tokens": state["tokens"],
                   "train_seconds": state["train_seconds"],
                   "tokens_per_s": state["tokens"] / max(state["train_seconds"], 1e-9),
                   "best_step": state["best_step"], "best_eval_f1": state["best_f1"],
                   "final_loss": state["history"][-1]["loss"] if state["history"] else None,
                   "finished": state["step"] >= total,
                   "mlflow_run_id": state.get("mlflow_run_id")}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        if tracker and summary["finished"]:
            tracker.finish(summary)
        self.model, self.tokenizer = model, tok
        return summary

    def _save(self, model, opt, sched, state, tok, best: bool, tracker, eval_row=None) -> Path:
        """Checkpoint folder written under a temporary name and renamed; then `latest` (and
        `best`) swapped. Older checkpoints beyond `keep` are deleted unless an alias holds them."""
        import torch

        name = f"step-{state['step']:06d}"
        final = self.ckpt_root / name
        if not final.exists():
            tmp = self.ckpt_root / f".{name}.tmp"
            if tmp.exists():
                shutil.rmtree(tmp)
            model.save_pretrained(str(tmp))
            meta = {**self.meta(), "step": state["step"],
                    "eval": eval_row or {}, "best_eval_f1": state["best_f1"]}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "state": state, "rng": _rng_state()}, tmp / STATE_FILE)
            os.replace(tmp, final)
        _atomic_symlink(name, self.ckpt_root / "latest")  # every checkpoint is the newest
        if best:
            _atomic_symlink(name, self.ckpt_root / "best")
        self._prune()
        if tracker:
            tracker.checkpoint(final, "best" if best else "latest", state, eval_row)
        return final

    def _prune(self) -> None:
        held = {p.name for a in ("latest", "best") if (p := alias_path(self.out, a))}
        ckpts = sorted(p for p in self.ckpt_root.glob("step-*") if p.is_dir())
        for p in ckpts[:-self.cfg.checkpoint.keep]:
            if p.name not in held:
                shutil.rmtree(p, ignore_errors=True)


# --------------------------------------------------------------------------- export


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path,
                  base_path: str | Path | None = None) -> Path:
    """Base + LoRA merged into a plain HF folder (safetensors + tokenizer): a `format: hf`
    generator any part of the stack loads. The base comes from the adapter's meta.json."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir = Path(adapter_dir)
    meta = json.loads((adapter_dir / "meta.json").read_text()) \
        if (adapter_dir / "meta.json").exists() else {}
    base = Path(base_path or meta.get("base_path") or "")
    if not (base / "config.json").exists():
        raise ConfigError("base_path", f"no base model at {base!s} for adapter {adapter_dir}")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)),
                                      str(adapter_dir))
    merged = model.merge_and_unload()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(str(tmp))
    load_tokenizer(base).save_pretrained(str(tmp))
    (tmp / "ragpilot_meta.json").write_text(json.dumps({**meta, "adapter": str(adapter_dir)},
                                                       indent=1, default=str))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def write_registry_entry(models_yaml: str | Path, name: str, model_dir: str | Path) -> Path:
    """Add (or replace) `name: {kind: generator, format: hf, path: model_dir}` in a registry
    YAML (configs/rag/models.yaml layout); point RAGPILOT_MODELS at it, then `generator: name`
    in a RAG config selects the trained model (tuner and bandit included)."""
    p = Path(models_yaml)
    data = yaml.safe_load(p.read_text()) if p.exists() else None
    data = data or {}
    models = data.get("models") or {}
    models[name] = {"kind": "generator", "format": "hf", "path": str(Path(model_dir).resolve())}
    data["models"] = models
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=True))
    return p


# --------------------------------------------------------------------------- MLflow


class _Tracker:
    """MLflow run for a training: params = meta, metrics per step, checkpoints as artifacts,
    `latest`/`best` as registered-model aliases (local store) and as run tags."""

    def __init__(self, run: SFTRun, state: dict[str, Any]):
        import mlflow

        from rag.provenance import provenance_tags
        from rl.common.tracking import tracking_uri

        self.mlflow, self.run = mlflow, run
        uri = run.mlflow_uri or tracking_uri(run.cfg.mlflow.dir)
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(run.cfg.mlflow.experiment)
        self.client = mlflow.MlflowClient()
        if state.get("mlflow_run_id"):
            self.run_id = state["mlflow_run_id"]
        else:
            r = self.client.create_run(mlflow.get_experiment_by_name(
                run.cfg.mlflow.experiment).experiment_id, run_name=run.out.name)
            self.run_id = r.info.run_id
            state["mlflow_run_id"] = self.run_id
            for k, v in run.meta().items():
                self.client.log_param(self.run_id, k, str(v))
            for k, v in provenance_tags(run.data_manifest).items():
                self.client.set_tag(self.run_id, k, v)
            self.client.log_text(self.run_id, json.dumps(run.data_manifest, indent=2,
                                                         sort_keys=True, default=str),
                                 "dataset_manifest.json")
        self.model_name = f"{run.cfg.mlflow.experiment}-{run.out.name}"
        self.aliases_in_registry = False

    def metrics(self, row: dict[str, Any], step: int) -> None:
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self.client.log_metric(self.run_id, k, float(v), step=step)

    def checkpoint(self, path: Path, alias: str, state: dict[str, Any], eval_row) -> None:
        self.client.log_artifacts(self.run_id, str(path), f"checkpoints/{path.name}")
        self.client.set_tag(self.run_id, f"alias.{alias}", path.name)
        self.client.set_tag(self.run_id, f"alias.{alias}.step", str(state["step"]))
        if eval_row:
            for k in ("eval_f1", "eval_em"):
                if k in eval_row:
                    self.client.set_tag(self.run_id, f"alias.{alias}.{k}", f"{eval_row[k]:.4f}")
        if not self.run.cfg.mlflow.register_model:
            return
        try:
            from mlflow.exceptions import MlflowException

            try:
                self.client.get_registered_model(self.model_name)
            except MlflowException:
                self.client.create_registered_model(self.model_name)
            run = self.client.get_run(self.run_id)
            src = f"{run.info.artifact_uri}/checkpoints/{path.name}"
            tags = {"step": str(state["step"]), "base_model": self.run.cfg.base_model,
                    "lora_r": str(self.run.cfg.lora.r), "max_len": str(self.run.cfg.max_len)}
            if eval_row:
                tags.update({k: f"{v:.4f}" for k, v in eval_row.items()})
            mv = self.client.create_model_version(self.model_name, src, run_id=self.run_id,
                                                  tags=tags)
            # MLflow reserves `latest` (models:/<name>/latest = the newest version, which every
            # checkpoint is); the explicit registry alias for it is `newest`
            self.client.set_registered_model_alias(
                self.model_name, "newest" if alias == "latest" else alias, mv.version)
            if alias == "best":
                self.client.set_registered_model_alias(self.model_name, "newest", mv.version)
            self.aliases_in_registry = True
        except Exception as exc:  # the tags above already carry the aliases
            self.client.set_tag(self.run_id, "registry_error", str(exc)[:200])

    def finish(self, summary: dict[str, Any]) -> None:
        self.client.log_text(self.run_id, json.dumps(summary, indent=1, default=str),
                             "summary.json")
        self.client.set_terminated(self.run_id)
