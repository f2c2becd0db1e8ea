"""Quantised inference of a (fine-tuned) generator: fp32 vs int8 on CPU, bf16 vs bitsandbytes
8/4-bit on GPU. Latency per generated token, peak memory, and answer quality on the same
questions.

CPU int8 is torch dynamic quantisation (`torch.ao.quantization.quantize_dynamic` on every
`nn.Linear`: int8 weights, activations quantised on the fly) — no calibration data, no GPU.
bitsandbytes (`bnb8` = LLM.int8, `bnb4` = nf4) needs CUDA and is refused on CPU with a typed
error. Each mode is measured in its own process (`python -m rl.adaptation.quant ...`) so peak RSS
(`ru_maxrss`) belongs to that mode alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rag.errors import ConfigError
from rag.metrics.qa import best_em_f1
from rl.adaptation.generator_model import generate_answers, load_tokenizer
from rl.adaptation.sft_data import SFTExample, load_examples

Mode = Literal["fp32", "int8", "bf16", "bnb8", "bnb4"]
MODES: tuple[str, ...] = ("fp32", "int8", "bf16", "bnb8", "bnb4")
GPU_MODES = ("bf16", "bnb8", "bnb4")  # bf16: the unquantised GPU baseline


def quantize_int8(model):
    """Dynamic int8 quantisation of every nn.Linear (weights int8, per-tensor activations)."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def load_for_inference(path: str | Path, mode: str):
    """(model, tokenizer) in `mode`. GPU modes without a visible GPU -> ConfigError("quant.mode")."""
    import torch
    from transformers import AutoModelForCausalLM

    if mode not in MODES:
        raise ConfigError("quant.mode", f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    tok = load_tokenizer(path)
    if mode in GPU_MODES:
        if not torch.cuda.is_available():
            raise ConfigError("quant.mode", f"{mode} needs a CUDA GPU; use fp32 or int8 on CPU")
        if mode == "bf16":
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
            return model.to("cuda").eval(), tok
        from transformers import BitsAndBytesConfig

        q = (BitsAndBytesConfig(load_in_8bit=True) if mode == "bnb8" else
             BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_compute_dtype=torch.bfloat16))
        model = AutoModelForCausalLM.from_pretrained(str(path), quantization_config=q,
                                                     device_map={"": 0})
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path))
        if mode == "int8":
            model = quantize_int8(model)
    model.eval()
    return model, tok


def _rss_mb(field: str = "VmHWM") -> float:
    """RSS of this process in MiB: VmHWM = peak (reset by exec, unlike ru_maxrss, which a child
    inherits from the process that forked it), VmRSS = now."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(path: str | Path, mode: str, examples: Sequence[SFTExample], prompt_id: str,
            max_new_tokens: int = 24, threads: int = 1) -> dict[str, Any]:
    """Load in `mode`, answer every example one at a time (latency as served), return
    ms_per_token, ms_per_answer, per-example f1/em, load seconds, resident MiB after load
    (`rss_loaded_mb`) and peak MiB (`peak_rss_mb`: int8 includes the fp32 weights it was
    quantised from)."""
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model, tok = load_for_inference(path, mode)
    load_s = time.perf_counter() - t0
    import gc

    gc.collect()
    rss_loaded = _rss_mb("VmRSS")  # resident after load (int8: the fp32 copy is freed)
    generate_answers(model, tok, [examples[0].question], [list(examples[0].contexts)],
                     prompt_id, max_new_tokens, 1)  # warm-up (kernels, caches)
    t1 = time.perf_counter()
    gens = generate_answers(model, tok, [e.question for e in examples],
                            [list(e.contexts) for e in examples], prompt_id, max_new_tokens, 1)
    secs = time.perf_counter() - t1
    toks = sum(g["tokens_out"] for g in gens)
    scores = [best_em_f1(g["text"], e.answers) for g, e in zip(gens, examples, strict=True)]
    return {"mode": mode, "n": len(examples), "load_s": load_s, "seconds": secs,
            "tokens_out": toks, "ms_per_token": 1000 * secs / max(toks, 1),
            "ms_per_answer": 1000 * secs / max(len(examples), 1),
            "em": [s[0] for s in scores], "f1": [s[1] for s in scores],
            "answers": [g["text"] for g in gens], "rss_loaded_mb": rss_loaded,
            "peak_rss_mb": _rss_mb(), "threads": threads}


def measure_in_subprocess(path: str | Path, mode: str, examples_jsonl: str | Path,
                          prompt_id: str, out_json: str | Path, max_new_tokens: int = 24,
                          limit: int | None = None, threads: int = 1) -> dict[str, Any]:
    """`measure` in a fresh interpreter (clean peak RSS); returns its JSON result."""
    cmd = [sys.executable, "-m", "rl.adaptation.quant", "--model", str(path), "--mode", mode,
           "--examples", str(examples_jsonl), "--prompt-id", prompt_id, "--out", str(out_json),
           "--max-new-tokens", str(max_new_tokens), "--threads", str(threads)]
    if limit:
        cmd += ["--limit", str(limit)]
    import os

    import rl

    src = str(Path(next(iter(rl.__path__))).resolve().parent)  # where the child finds `rl`

    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"quant child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(Path(out_json).read_text())


def main(argv: list[str] | None = None) -> int:
    from rag.env import configure_runtime_env

    configure_runtime_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=MODES, default="fp32")
    ap.add_argument("--examples", required=True, help="SFT-example JSONL (rl.adaptation.sft_data)")
    ap.add_argument("--prompt-id", default="cite_concise")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    ex = load_examples(a.examples)[: a.limit or None]
    res = measure(a.model, a.mode, ex, a.prompt_id, a.max_new_tokens, a.threads)
    Path(a.out).write_text(json.dumps(res))
    print(f"{a.mode}: {res['ms_per_token']:.1f} ms/token, peak {res['peak_rss_mb']:.0f} MiB, "
          f"f1 {sum(res['f1']) / max(len(res['f1']), 1):.3f} (n={res['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
