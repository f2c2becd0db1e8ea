"""The generator being adapted: base model, tokenizer and LoRA loading, training-example
encoding in the served prompt format, and greedy generation / answer-F1 evaluation.

Everything here matches the serving path (`rag.generation.local.TransformersGenerator`): the
same prompt template and chat template, the same answer parsing, so what is trained and
evaluated is what is served.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag.errors import ConfigError
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.metrics.qa import best_em_f1
from rl.adaptation.generator_config import GeneratorSFTConfig
from rl.adaptation.sft_data import SFTExample

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

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=cfg.qlora_gradient_checkpointing)
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
