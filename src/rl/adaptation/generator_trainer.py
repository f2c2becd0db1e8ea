"""Generator SFT trainer: LoRA SFT (peft, plain torch loop) with exact checkpoint/resume.

The config is `rl.adaptation.generator_config.GeneratorSFTConfig`; model loading, encoding and
evaluation live in `rl.adaptation.generator_model`, merging and registration in
`rl.adaptation.generator_export`, DPO / IPO / ORPO in `rl.adaptation.prefs`.

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
from pathlib import Path
from typing import Any, Literal

from rag.errors import ConfigError
from rl.adaptation.generator_config import GeneratorSFTConfig
from rl.adaptation.generator_model import (
    add_lora,
    encode_example,
    eval_f1,
    load_base_model,
    load_tokenizer,
    resolve_base,
)
from rl.adaptation.sft_data import SFTExample, examples_manifest

CKPT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"

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


def _first_target(labels: Sequence[int]) -> int:
    """Index of the first scored (non -100) label; len(labels) when none is."""
    return next((i for i, t in enumerate(labels) if t != -100), len(labels))


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
                # the LM head (vocab 49k) only where a target token is predicted: the prompt's
                # logits are never scored, and computing them was ~1/5 of a step on CPU
                keep = min(len(lab), len(lab) - _first_target(lab) + 1)
                y = torch.tensor([lab[len(lab) - keep + 1:]], device=model.device)
                logits = model(input_ids=x, logits_to_keep=keep).logits[:, :-1].float()
                tok_loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
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

