"""Preference alignment of the generator with TRL: DPO, IPO (DPO with loss_type="ipo") and ORPO
(`trl.experimental.orpo`), each on a LoRA adapter over the policy (normally the merged SFT model).

Pairs share the question and the contexts. `chosen` is the gold-format answer (`<answer> [i][j]`,
from the train split only); `rejected` is what the policy itself produces when sampled, kept only
when the ranker scores it below the chosen one, so each pair teaches a mistake the model actually
makes. Rankers: `f1` (answer F1 vs gold + citation precision, HotpotQA definitions), `quality`
(f1 + `rag.metrics.quality.QualityScorer` faithfulness of the cited contexts), `auto` = the
project's learned reward model (`rag.metrics.reward_model`) when it is installed, else `f1`.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from rag.errors import ConfigError
from rag.metrics.qa import best_em_f1
from rl.alignment.sft import (
    GeneratorSFTConfig,
    check_qlora,
    end_of_turn,
    generate_answers,
    load_base_model,
    load_tokenizer,
    render_prompt,
)
from rl.alignment.sft_data import SFTExample

Method = Literal["dpo", "ipo", "orpo"]
METHODS: tuple[str, ...] = ("dpo", "ipo", "orpo")
Ranker = Callable[[SFTExample, str, Sequence[int]], float]


def f1_ranker(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
    """Answer F1 vs gold plus half the citation precision (a right answer citing the wrong
    passages ranks below one citing the right ones)."""
    f1 = best_em_f1(text, ex.answers)[1] if ex.answers else 0.0
    cited = set(citations)
    prec = len(cited & set(ex.gold_positions)) / len(cited) if cited else 0.0
    return f1 + 0.5 * prec


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


def make_ranker(kind: str) -> tuple[str, Ranker]:
    """(name actually used, ranker). `auto` prefers the learned reward model when present."""
    if kind == "auto":
        if importlib.util.find_spec("rag.metrics.reward_model") is not None:
            try:
                from rag.metrics import reward_model  # type: ignore[attr-defined]

                rm = reward_model.load_default()  # type: ignore[attr-defined]

                def rank(ex: SFTExample, text: str, citations: Sequence[int]) -> float:
                    return float(rm.score(ex.question, [c.text for c in ex.contexts], text))

                return "reward_model", rank
            except Exception:  # not trained yet / different API: fall back honestly
                pass
        return "f1", f1_ranker
    if kind == "f1":
        return "f1", f1_ranker
    if kind == "quality":
        return "quality", quality_ranker()
    raise ConfigError("generator_sft.prefs.ranker", f"unknown ranker {kind!r}")


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
                     "chosen_score": chosen_score, "rejected_score": s_rej})
    return rows


def save_pairs(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def train_preferences(method: str, policy_path: str | Path, pairs: Sequence[dict[str, Any]],
                      cfg: GeneratorSFTConfig, out_dir: str | Path) -> dict[str, Any]:
    """A LoRA adapter trained on `pairs` with TRL; saved to out_dir/adapter (+ meta.json so
    `rl.alignment.sft.merge_adapter` can merge it onto the policy). Returns train metrics:
    loss, reward accuracy/margin where TRL logs them, seconds, steps."""
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
    ds = Dataset.from_list([{"prompt": r["prompt"], "chosen": r["chosen"] + eot,
                             "rejected": r["rejected"] + eot} for r in pairs])
    peft_cfg = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha,
                          lora_dropout=cfg.lora.dropout,
                          target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")
    p = cfg.prefs
    common = {"output_dir": str(out / "trl"), "max_steps": p.steps,
              "per_device_train_batch_size": p.batch_size, "learning_rate": p.lr,
              "beta": p.beta, "max_length": cfg.max_len, "logging_steps": 1,
              "save_strategy": "no", "report_to": "none", "seed": cfg.train.seed,
              "use_cpu": cfg.device == "cpu", "lr_scheduler_type": "constant",
              "gradient_checkpointing": False, "dataloader_num_workers": 0}
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
            "beta": p.beta, "steps": p.steps, "n_pairs": len(pairs), "seconds": secs,
            "train_loss": float(result.training_loss), "first_loss": logs[0]["loss"]
            if logs else None, "last_loss": logs[-1]["loss"] if logs else None}
    for key in ("rewards/accuracies", "rewards/margins", "log_odds_ratio"):
        vals = [h[key] for h in logs if key in h]
        if vals:
            tail = vals[-max(1, len(vals) // 3):]
            meta[key.replace("/", "_")] = float(sum(tail) / len(tail))
    (adapter / "meta.json").write_text(json.dumps(meta, indent=1))
    (out / "summary.json").write_text(json.dumps(meta, indent=1))
    return meta
