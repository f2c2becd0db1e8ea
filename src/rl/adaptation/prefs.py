"""Preference alignment of the generator with TRL: DPO, IPO (DPO with loss_type="ipo") and ORPO
(`trl.experimental.orpo`), each on a LoRA adapter over the policy (normally the merged SFT model).

Pairs share the question and the contexts. `chosen` is the gold-format answer (`<answer> [i][j]`,
from the train split only); `rejected` is what the policy itself produces when sampled, kept only
when the ranker scores it below the chosen one, so each pair teaches a mistake the model actually
makes. Rankers: `f1` (answer F1 vs gold + citation precision, HotpotQA definitions), `quality`
(f1 + `rag.metrics.quality.QualityScorer` faithfulness of the cited contexts), `auto` = the
project's learned reward model (`rag.metrics.reward_model.load_default`: quality-rm, found in
$RAGPILOT_REWARD_MODELS, the cache, or the copy shipped under rag/bundled/reward_models)
scoring the answer against its cited contexts, else `f1` when none is installed; `judge` = an
LLM grading the answer against the gold answer (`judge_ranker`: the reference-guided pointwise
judge of `rag.metrics.pairwise_judge`, `prefs.judge_model`, Qwen2.5-Coder-1.5B by default).
Each pair row and the run's summary name the ranker actually used.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rag.errors import ConfigError
from rag.metrics.qa import best_em_f1
from rl.adaptation.generator_config import GeneratorSFTConfig
from rl.adaptation.generator_model import (
    check_qlora,
    end_of_turn,
    generate_answers,
    load_base_model,
    load_tokenizer,
    render_prompt,
)
from rl.adaptation.sft_data import SFTExample, hotpot_inputs_if_train

Method = Literal["dpo", "ipo", "orpo"]
METHODS: tuple[str, ...] = ("dpo", "ipo", "orpo")
Ranker = Callable[[SFTExample, str, Sequence[int]], float]


def citation_precision(ex: SFTExample, citations: Sequence[int]) -> float:
    """Share of the cited passage numbers that are gold passages (0 when nothing is cited)."""
    cited = set(citations)
    return len(cited & set(ex.gold_positions)) / len(cited) if cited else 0.0


def f1_ranker(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
    """Answer F1 vs gold plus half the citation precision (a right answer citing the wrong
    passages ranks below one citing the right ones)."""
    f1 = best_em_f1(text, ex.answers)[1] if ex.answers else 0.0
    return f1 + 0.5 * citation_precision(ex, citations)


def quality_ranker(scorer=None) -> Ranker:
    """f1_ranker + QualityScorer faithfulness (claims of the answer supported by the cited
    contexts, MiniLM-based, deterministic)."""
    from rag.metrics.quality import QualityScorer
    from rag.types import Answer

    qs = scorer or QualityScorer()

    def rank(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
        ans = Answer(ex.id, ex.question, text, tuple(citations), ex.contexts, (), {}, 0, 0, "")
        faith = qs.score(ans).get("faithfulness", 0.0)
        return f1_ranker(ex, text, citations) + 0.5 * faith

    return rank


def reward_model_ranker(rm) -> Ranker:
    """The learned reward model's score of the answer against the contexts it cites (all of
    them when it cites none), like the faithfulness of `quality_ranker`. Only differences
    between answers to one question mean anything, which is all `build_pairs` uses."""

    def rank(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
        n = len(ex.contexts)
        cited = sorted({i for i in citations if 1 <= i <= n})
        ctx = [ex.contexts[i - 1] for i in cited] if cited else list(ex.contexts)
        return float(rm.score(ex.question, ctx, text))

    return rank


def judge_ranker(backend) -> Ranker:
    """The reference-guided pointwise judge (`rag.metrics.pairwise_judge.PointwiseJudgeBackend`
    or anything with its `grade`): p(Yes) that the answer gives the gold answer(s), as the
    sigmoid of the judge's grade, plus half the citation precision as in `f1_ranker`. Unlike
    F1 it can credit a paraphrase and refuse an answer that only shares words with the gold
    one (docs/retired_studies.md, `judge_reference`: how far it agrees with F1). Each distinct
    answer is graded once."""
    import math

    from rag.metrics.pairwise_judge import reference_text

    def rank(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
        if not ex.answers:
            raise ConfigError("generator_sft.prefs.ranker",
                              f"the judge ranker needs gold answers; example {ex.id} has none")
        g = float(backend.grade([(ex.question, text, reference_text(ex.answers))])[0])
        return 1.0 / (1.0 + math.exp(-g)) + 0.5 * citation_precision(ex, citations)

    return rank


def make_ranker(kind: str, judge_model: str = "qwen2.5-coder-1.5b-instruct",
                device: str = "cpu") -> tuple[str, Ranker]:
    """(name actually used, ranker). `auto` = the installed reward model
    (`rag.metrics.reward_model.find_reward_model(DEFAULT_NAME)`: $RAGPILOT_REWARD_MODELS, the
    cache, then the model shipped under rag/bundled/reward_models), named
    `reward_model:<name>/v<k>`; `f1` only when no reward model is installed. An installed model
    that cannot be read raises (DataError) instead of silently changing the ranker."""
    if kind == "auto":
        from rag.metrics.reward_model import DEFAULT_NAME, find_reward_model, load_reward_model

        path = find_reward_model(DEFAULT_NAME)
        if path is None:
            return _named("f1", f1_ranker)
        rm = load_reward_model(path)
        name = f"reward_model:{rm.manifest.get('name', DEFAULT_NAME)}/v{rm.manifest.get('version')}"
        return _named(name, reward_model_ranker(rm))
    if kind == "f1":
        return _named("f1", f1_ranker)
    if kind == "quality":
        return _named("quality", quality_ranker())
    if kind == "judge":
        from rag.generation.local import TransformersGenerator
        from rag.metrics.pairwise_judge import PointwiseJudgeBackend
        from rag.models import default_registry

        gen = TransformersGenerator(default_registry().get(judge_model), device=device,
                                    cache=False)
        backend = PointwiseJudgeBackend(gen.choice_logprobs, gen.fingerprint)
        return _named(f"judge:{judge_model}+reference:pointwise", judge_ranker(backend))
    raise ConfigError("generator_sft.prefs.ranker", f"unknown ranker {kind!r}")


def _named(name: str, ranker: Ranker) -> tuple[str, Ranker]:
    """Tag the ranker with its name, so the pairs (and the run's summary) record it."""

    def rank(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
        return ranker(ex, text, citations)

    rank.ranker_name = name  # type: ignore[attr-defined]
    return name, rank


def ranker_name(ranker: Ranker) -> str:
    return str(getattr(ranker, "ranker_name", None) or getattr(ranker, "__name__", "custom"))


def build_pairs(model, tokenizer, examples: Sequence[SFTExample], cfg: GeneratorSFTConfig,
                ranker: Ranker, n_samples: int = 2) -> list[dict[str, Any]]:
    """Prompt/chosen/rejected rows (plain strings, prompt already chat-templated). For each
    example the policy answers greedily and with `n_samples` samples; the lowest-ranked answer
    below the chosen one is the rejected side; examples where every answer ties the gold are
    skipped (nothing to learn)."""
    qs = [e.question for e in examples]
    cs = [list(e.contexts) for e in examples]
    cands = [generate_answers(model, tokenizer, qs, cs, cfg.prompt_id,
                              cfg.eval.max_new_tokens, cfg.eval.batch_size)]
    for _ in range(n_samples):
        cands.append(generate_answers(model, tokenizer, qs, cs, cfg.prompt_id,
                                      cfg.eval.max_new_tokens, cfg.eval.batch_size,
                                      temperature=cfg.prefs.temperature))
    rows = []
    rname = ranker_name(ranker)
    for i, ex in enumerate(examples):
        chosen_score = ranker(ex, ex.answers[0] if ex.answers else ex.target,
                              ex.gold_positions)
        scored = [(ranker(ex, c[i]["text"], c[i]["citations"]), c[i]["raw"].strip())
                  for c in cands if c[i]["raw"].strip()]
        worse = [(s, raw) for s, raw in scored if s < chosen_score - 1e-9]
        if not worse:
            continue
        s_rej, rejected = min(worse)
        rows.append({"prompt": render_prompt(tokenizer, ex.question, ex.contexts, cfg.prompt_id),
                     "chosen": ex.target, "rejected": rejected, "id": ex.id,
                     "source": ex.source, "chosen_score": chosen_score,
                     "rejected_score": s_rej, "ranker": rname})
    return rows


def save_pairs(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


PAIR_FIELDS = ("prompt", "chosen", "rejected")


def load_pairs(path: str | Path) -> list[dict[str, Any]]:
    """Pair rows written by `save_pairs` (or by another machine in the same format: `prompt`
    already chat-templated for the policy, `chosen`, `rejected`, and optionally `id`, `source`,
    `chosen_score`, `rejected_score`, `ranker`). A row missing a field, with an empty side or
    with chosen == rejected raises DataError(path, line)."""
    from rag.corpus.loaders import iter_jsonl
    from rag.errors import DataError

    rows = []
    for n, rec in iter_jsonl(path):
        for key in PAIR_FIELDS:
            if not isinstance(rec.get(key), str) or not rec[key].strip():
                raise DataError(str(path), f"pair field {key!r} missing or empty", line=n)
        if rec["chosen"].strip() == rec["rejected"].strip():
            raise DataError(str(path), "chosen == rejected teaches nothing", line=n)
        rows.append(rec)
    return rows


def pairs_manifest(pairs: Sequence[dict[str, Any]],
                   base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The dataset manifest of a preference run: the manifest of the examples the pairs were
    built from (`base`, e.g. `sft_data.examples_manifest(train[:n_pairs])`; by default one
    derived from the pair rows: their ids and sources, the HotpotQA input files when every row
    comes from HotpotQA) plus the pair count, the sha256 of the pair rows and the ranker."""
    if base is None:
        sources = sorted({str(r.get("source", "unknown")) for r in pairs})
        ids = list(dict.fromkeys(str(r.get("id")) for r in pairs))
        inputs = hotpot_inputs_if_train(ids) if sources == ["hotpotqa"] else []
        ids_sha = hashlib.sha256("".join(f"{i}\n" for i in ids).encode()).hexdigest()
        base = {"dataset": "+".join(sources) or "none", "split": "train", "examples": len(ids),
                "ids_sha256": ids_sha, "inputs": inputs}
    blob = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False, default=str) + "\n"
                   for r in pairs)
    rankers = sorted({str(r["ranker"]) for r in pairs if r.get("ranker")})
    return {**dict(base), "pairs": len(pairs),
            "pairs_sha256": hashlib.sha256(blob.encode()).hexdigest(),
            "ranker": "+".join(rankers) or "unknown"}


def _log_run(cfg: GeneratorSFTConfig, out: Path, meta: dict[str, Any],
             manifest: Mapping[str, Any], mlflow_uri: str | None) -> str:
    """One MLflow run of a preference training (experiment `mlflow.experiment`): params, the
    loss/reward metrics, provenance tags (rag.provenance: commit, dataset manifest, input
    sha256s) + the ranker, the manifest and summary as artifacts. Returns the run id."""
    import mlflow

    from rag.provenance import provenance_tags
    from rl.common.tracking import tracking_uri

    mlflow.set_tracking_uri(mlflow_uri or tracking_uri(cfg.mlflow.dir))
    mlflow.set_experiment(cfg.mlflow.experiment)
    with mlflow.start_run(run_name=f"{meta['method']}-{out.name}") as run:
        mlflow.log_params({k: str(meta[k]) for k in ("method", "base_path", "base_model",
                                                     "lora_r", "max_len", "beta", "steps",
                                                     "n_pairs", "ranker") if k in meta})
        mlflow.log_params({"lr": str(cfg.prefs.lr), "batch_size": str(cfg.prefs.batch_size)})
        mlflow.log_metrics({k: float(v) for k, v in meta.items()
                            if k in ("seconds", "train_loss", "first_loss", "last_loss",
                                     "rewards_accuracies", "rewards_margins", "log_odds_ratio")
                            and isinstance(v, (int, float))})
        mlflow.set_tags({**provenance_tags(manifest), "ranker": str(meta.get("ranker"))})
        mlflow.log_text(json.dumps(dict(manifest), indent=2, sort_keys=True, default=str),
                        "dataset_manifest.json")
        mlflow.log_text(json.dumps(meta, indent=1, default=str), "summary.json")
        return run.info.run_id


def trainer_args(cfg: GeneratorSFTConfig, output_dir: str | Path) -> dict[str, Any]:
    """The TRL DPO/ORPO arguments shared by every method. Mixed precision follows the device:
    TRL's configs default to `bf16=True`, which on a CPU autocasts every matmul to bf16, a
    scalar kernel (`bf16_dot_with_fp32_arith`) on CPUs without bf16 instructions; here bf16
    is used only where a CUDA GPU supports it (measurements: docs/design-notes.md)."""
    p = cfg.prefs
    return {"output_dir": str(output_dir), "max_steps": p.steps,
            "per_device_train_batch_size": p.batch_size, "learning_rate": p.lr,
            "beta": p.beta, "max_length": cfg.max_len, "logging_steps": 1,
            "save_strategy": "no", "report_to": "none", "seed": cfg.train.seed,
            "use_cpu": cfg.device == "cpu", "bf16": cfg.device == "cuda", "fp16": False,
            "lr_scheduler_type": "constant", "gradient_checkpointing": False,
            "dataloader_num_workers": 0}


def fit_pairs(tok, pairs: Sequence[dict[str, Any]], max_len: int, eot: str = ""
              ) -> tuple[list[dict[str, Any]], int]:
    """(the pairs whose prompt plus longer answer, end-of-turn included, fit `max_len` tokens,
    how many did not). TRL handles the others differently per method, and silently: DPO/IPO
    drop a pair whose prompt alone fills max_length and cut the answers of the rest short;
    ORPO keeps it with an empty answer, whose per-token mean log-probability is 0/0, so the
    first such batch turns the loss and then the weights into NaN. One rule for all methods
    makes them train on the same pairs, and the count goes into the run's summary. One token
    is kept for the BOS/EOS a trainer may add."""
    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    fits = [r for r in pairs if n(r["prompt"]) + max(n(r["chosen"] + eot), n(r["rejected"] + eot))
            + 1 <= max_len]
    return fits, len(pairs) - len(fits)


def train_preferences(method: str, policy_path: str | Path, pairs: Sequence[dict[str, Any]],
                      cfg: GeneratorSFTConfig, out_dir: str | Path, *,
                      data_manifest: Mapping[str, Any] | None = None,
                      mlflow_uri: str | None = None) -> dict[str, Any]:
    """A LoRA adapter trained on `pairs` with TRL; saved to out_dir/adapter (+ meta.json so
    `rl.adaptation.generator_export.merge_adapter` can merge it onto the policy). Returns train metrics:
    loss, reward accuracy/margin where TRL logs them, seconds, steps, the ranker that built the
    pairs. `data_manifest` (default `pairs_manifest(pairs)`) goes to out_dir/dataset_manifest.json
    and, when `mlflow.enabled`, to an MLflow run's provenance tags (`mlflow_run_id` in the
    result)."""
    if method not in METHODS:
        raise ConfigError("method", f"unknown preference method {method!r} (known: "
                                    f"{', '.join(METHODS)})")
    if not pairs:
        raise ConfigError("pairs", "no preference pairs (the policy matched gold everywhere?)")
    check_qlora(cfg)
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    if cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    out = Path(out_dir)
    tok = load_tokenizer(policy_path)
    model = load_base_model(policy_path, cfg)
    eot = end_of_turn(tok)
    given = len(pairs)
    pairs, too_long = fit_pairs(tok, pairs, cfg.max_len, eot)
    if too_long:
        print(f"[{method}] {too_long} of {given} pairs do not fit max_len {cfg.max_len} "
              f"(prompt + answer) and are left out; {len(pairs)} train", flush=True)
    if not pairs:
        raise ConfigError("generator_sft.max_len", f"no pair fits max_len {cfg.max_len} tokens "
                                                   f"(prompt + answer); raise it")
    ds = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"] + eot,
                             "rejected": r["rejected"] + eot} for r in pairs])
    peft_cfg = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
                          lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
    p = cfg.prefs
    common = trainer_args(cfg, out / "trl")
    t0 = time.perf_counter()
    if method == "orpo":
        import os

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        args = ORPOConfig(**common)
        trainer = ORPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                              peft_config=peft_cfg)
    else:
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, loss_type="ipo" if method == "ipo" else "sigmoid")
        trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                             peft_config=peft_cfg)
    result = trainer.train()
    secs = time.perf_counter() - t0
    adapter = out / "adapter"
    trainer.model.save_pretrained(str(adapter))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    meta = {"method": method, "base_path": str(Path(policy_path).resolve()),
            "base_model": cfg.base_model, "lora_r": cfg.lora.r, "max_len": cfg.max_len,
            "beta": p.beta, "steps": p.steps, "batch_size": p.batch_size, "lr": p.lr,
            "n_pairs": len(pairs), "n_pairs_given": given,
            "n_pairs_too_long": too_long, "seconds": secs,
            "train_loss": float(result.training_loss), "first_loss": logs[0]["loss"]
            if logs else None, "last_loss": logs[-1]["loss"] if logs else None}
    for key in ("rewards/accuracies", "rewards/margins", "log_odds_ratio"):
        vals = [h[key] for h in logs if key in h]
        if vals:
            tail = vals[-max(1, len(vals) // 3):]
            meta[key.replace("/", "_")] = float(sum(tail) / len(tail))
    meta["ranker"] = "+".join(sorted({str(r["ranker"]) for r in pairs if r.get("ranker")})) \
        or "unknown"
    manifest = dict(data_manifest) if data_manifest is not None else pairs_manifest(pairs)
    (out / "dataset_manifest.json").write_text(
        json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n")
    if cfg.mlflow.enabled:
        meta["mlflow_run_id"] = _log_run(cfg, out, meta, manifest, mlflow_uri)
    (adapter / "meta.json").write_text(json.dumps(meta, indent=1))
    (out / "summary.json").write_text(json.dumps(meta, indent=1))
    return meta
