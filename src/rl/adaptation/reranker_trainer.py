"""Cross-encoder reranker trainer: batches, the training loop, and the whole job.

The config is `rl.adaptation.reranker_config.RerankerTrainConfig`; the model it starts from is
built by `rl.adaptation.reranker_model`. Training (CPU, one or two threads):
- groups of 1 gold passage + (group_size - 1) negatives per query, listwise softmax
  cross-entropy (or a pairwise margin loss) over each group's logits;
- curriculum: for the first `hard_phase` of the steps negatives come from the head of the
  retrieval list (the hardest non-gold candidates), afterwards half from anywhere in the
  retrieval list and half random corpus passages;
- batches and dropout are seeded by (seed, step), and a checkpoint (model, optimiser,
  scheduler, step, loss history, token count) is written atomically every `checkpoint_every`
  steps, so a killed run resumes where it stopped and ends where an uninterrupted run ends.

`run_training` mines, trains, saves a versioned directory `<cache>/models/<name>/v<N>/`
(safetensors, tokenizer, manifest.json), evaluates it (`reranker_eval`) and registers it
(`reranker_export`) as `<name>` (latest), `<name>@v<N>` and `<name>@best`, so
`rerank: cross_encoder, reranker_model: <name>` selects it in any RAG config, the tuner's policy
and the bandit's arms.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import ConfigError, DataError
from rl.adaptation.data import TrainItem, items_hash
from rl.adaptation.reranker_config import RerankerTrainConfig
from rl.adaptation.reranker_eval import quick_eval
from rl.adaptation.reranker_export import (
    log_mlflow,
    models_root,
    next_version_dir,
    register_local,
    save_model,
)
from rl.adaptation.reranker_model import TrainResult, load_cross_encoder


# ---- batches ----------------------------------------------------------------------------------
def plan_steps(cfg: RerankerTrainConfig, n_items: int) -> int:
    n = min(n_items, cfg.max_items or n_items)
    return max(1, math.ceil(n * cfg.epochs / cfg.batch_groups))


def item_order(cfg: RerankerTrainConfig, n_items: int, steps: int) -> list[int]:
    """The item index of every group slot of the whole run (epochs concatenated, each a fresh
    seeded permutation), so step s's batch is a pure function of (seed, s)."""
    rng = np.random.default_rng(cfg.seed)
    pool = rng.permutation(n_items)[: min(n_items, cfg.max_items or n_items)]
    need = steps * cfg.batch_groups
    order: list[int] = []
    while len(order) < need:
        order.extend(int(i) for i in rng.permutation(pool))
    return order[:need]


def negatives_for(item: TrainItem, k: int, hard_phase: bool, hard_top: int,
                  rng: random.Random) -> list[str]:
    """k negatives: the curriculum's phase decides the pools (see module doc)."""
    if hard_phase:
        pools = [list(item.hard[:hard_top]), list(item.hard[hard_top:]), list(item.easy)]
        out: list[str] = []
        for pool in pools:
            rng.shuffle(pool)
            out.extend(pool[: k - len(out)])
            if len(out) == k:
                break
    else:
        hard, easy = list(item.hard), list(item.easy)
        rng.shuffle(hard)
        rng.shuffle(easy)
        n_hard = min(len(hard), (k + 1) // 2)
        out = hard[:n_hard] + easy[: k - n_hard]
        out += hard[n_hard: n_hard + k - len(out)]
    if not out:
        raise DataError(item.source, f"query {item.query_id!r} has no negatives")
    while len(out) < k:  # tiny corpora: repeat rather than change the group shape
        out.append(out[len(out) % max(1, len(out))])
    return out[:k]


def make_batch(cfg: RerankerTrainConfig, items: Sequence[TrainItem], order: Sequence[int],
               step: int, steps: int) -> tuple[list[str], list[str]]:
    """(queries, passages) of step `step`: batch_groups groups, positive first in each."""
    rng = random.Random(f"{cfg.seed}:{step}")
    hard = step < cfg.hard_phase * steps
    qs, ps = [], []
    for slot in range(step * cfg.batch_groups, (step + 1) * cfg.batch_groups):
        it = items[order[slot]]
        group = [it.positive, *negatives_for(it, cfg.group_size - 1, hard, cfg.hard_top, rng)]
        qs.extend([it.query] * len(group))
        ps.extend(group)
    return qs, ps


def group_loss(logits, cfg: RerankerTrainConfig):
    """Listwise: softmax cross-entropy with the positive at index 0. Margin: mean hinge
    max(0, margin - (s_pos - s_neg)) over the group's negatives."""
    import torch

    scores = logits.view(-1, cfg.group_size)
    if cfg.loss == "listwise":
        target = torch.zeros(scores.shape[0], dtype=torch.long)
        return torch.nn.functional.cross_entropy(scores, target)
    return torch.relu(cfg.margin - (scores[:, :1] - scores[:, 1:])).mean()



# ---- training ---------------------------------------------------------------------------------
def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint intact


def train_reranker(cfg: RerankerTrainConfig, items: Sequence[TrainItem], run_dir: str | Path,
                   *, stop_after: int | None = None, resume: bool = True,
                   log: Callable[[str], None] | None = None) -> TrainResult:
    """Train on `items`; checkpoints go to `run_dir/checkpoint.pt`. `stop_after` ends this call
    after that many steps (a stand-in for a kill: the checkpoint is written first); calling
    again with the same config and items resumes."""
    import torch

    if not items:
        raise DataError("reranker.data", "no training items (no gold passages mined)")
    torch.set_num_threads(cfg.threads)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "checkpoint.pt"
    data_hash = items_hash(items)
    steps = plan_steps(cfg, len(items))
    order = item_order(cfg, len(items), steps)
    torch.manual_seed(cfg.seed)  # the new head's initialisation
    tok, model = load_cross_encoder(cfg.base_model, cfg.pooler_init)
    head = [p for n, p in model.named_parameters() if n.startswith("classifier.")]
    body = [p for n, p in model.named_parameters() if not n.startswith("classifier.")]
    opt = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": head, "lr": cfg.head_lr}],
                            weight_decay=cfg.weight_decay)
    warm = max(1, int(cfg.warmup_frac * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    start, losses, seqs, tokens, secs, resumed = 0, [], 0, 0, 0.0, None
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["fingerprint"] != cfg.fingerprint() or state["data_hash"] != data_hash:
            raise ConfigError("reranker", f"checkpoint {ckpt} belongs to another config or data "
                                          "(delete it or use another run directory)")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start, losses = state["step"], list(state["losses"])
        seqs, tokens, secs = state["sequences"], state["tokens"], state["seconds"]
        resumed = start
        if log:
            log(f"resumed from step {start}/{steps}")

    def snapshot(step: int) -> None:
        _save_checkpoint(ckpt, {"fingerprint": cfg.fingerprint(), "data_hash": data_hash,
                                "step": step, "model": model.state_dict(),
                                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                                "losses": losses, "sequences": seqs, "tokens": tokens,
                                "seconds": secs})

    model.train()
    step = start
    while step < steps:
        if stop_after is not None and step - start >= stop_after:
            snapshot(step)
            break
        t0 = time.perf_counter()
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout: a function of (seed, step)
        qs, ps = make_batch(cfg, items, order, step, steps)
        enc = tok(qs, ps, truncation=True, max_length=cfg.max_length, padding=True,
                  return_tensors="pt")
        loss = group_loss(model(**enc).logits, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        seqs += len(qs)
        tokens += int(enc["attention_mask"].sum())
        secs += time.perf_counter() - t0
        step += 1
        if step % cfg.checkpoint_every == 0 or step == steps:
            snapshot(step)
        if log and (step % 10 == 0 or step == steps):
            recent = losses[-10:]
            log(f"step {step}/{steps} loss {sum(recent) / len(recent):.4f} "
                f"{seqs / max(secs, 1e-9):.2f} pairs/s {tokens / max(secs, 1e-9):.0f} tok/s")
    model.eval()
    return TrainResult(model, tok, step, steps, step >= steps, losses, seqs, tokens, secs,
                       resumed, data_hash)



# ---- the whole job ----------------------------------------------------------------------------
def mine_all(cfg: RerankerTrainConfig, log: Callable[[str], None] | None = None
             ) -> tuple[list[TrainItem], dict[str, Any]]:
    from rl.adaptation.data import mine_from_dataset

    items: list[TrainItem] = []
    sources: dict[str, Any] = {}
    for name, spec in cfg.data.sources.items():
        t0 = time.perf_counter()
        info: dict[str, Any] = {}
        got = mine_from_dataset(name, spec.split, cfg.data.retriever, cfg.data.depth,
                                cfg.data.n_hard, cfg.data.n_easy, spec.max_queries, cfg.seed,
                                info=info)
        sources[name] = {"split": spec.split, "items": len(got),
                         "queries": len({i.query_id for i in got}),
                         "data_hash": items_hash(got), "manifest": info.get("manifest")}
        if log:
            log(f"mined {len(got)} items from {name}/{spec.split} "
                f"({time.perf_counter() - t0:.1f} s)")
        items.extend(got)
    return items, sources


def run_training(cfg: RerankerTrainConfig, *, run_dir: str | Path | None = None,
                 stop_after: int | None = None, register: bool = True,
                 models_dir: str | Path | None = None,
                 log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Mine, train (resuming a matching checkpoint), evaluate, save a new version, register it
    locally and in MLflow. Returns a summary dict (the CLI prints it as JSON)."""
    from rl.adaptation.data import load_items, save_items

    run_dir = Path(run_dir) if run_dir else models_root() / cfg.name / "runs" / cfg.fingerprint()
    run_dir.mkdir(parents=True, exist_ok=True)
    items_path = run_dir / "items.jsonl"
    if items_path.exists():  # resume on the exact same pairs
        items = load_items(items_path)
        sources = json.loads((run_dir / "sources.json").read_text())
    else:
        items, sources = mine_all(cfg, log)
        save_items(items, items_path)
        (run_dir / "sources.json").write_text(json.dumps(sources, indent=1))
    res = train_reranker(cfg, items, run_dir, stop_after=stop_after, log=log)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": res.steps_done,
                               "steps_total": res.steps_total, "finished": res.finished,
                               "sequences": res.sequences, "tokens": res.tokens,
                               "train_seconds": round(res.seconds, 1),
                               "pairs_per_s": round(res.pairs_per_s, 3),
                               "tokens_per_s": round(res.tokens_per_s, 1),
                               "resumed_from": res.resumed_from}
    if not res.finished:
        return summary
    dest = next_version_dir(cfg.name, Path(models_dir) if models_dir else None)
    manifest = save_model(res, cfg, dest, {}, sources)
    metrics = quick_eval(dest, cfg.eval, cfg.data.retriever) if cfg.eval else {}
    manifest["eval"] = metrics
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    summary.update(model_dir=str(dest), eval=metrics)
    if register:
        aliases = register_local(cfg.name, dest, cfg.eval_key())
        summary["registered"] = {"latest": cfg.name, "version": f"{cfg.name}@{dest.name}",
                                 "best": f"{cfg.name}@best", **aliases}
        if cfg.mlflow:
            summary["mlflow"] = log_mlflow(cfg, manifest, dest, aliases)
    return summary

