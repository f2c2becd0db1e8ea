"""bitsandbytes on a lent GPU (issue 21 item 5): 8/4-bit inference of `smollm2-sft` (latency,
GPU memory, answer F1) and a QLoRA SFT of SmolLM2-135M (nf4 base, the seed's adapter shape).

Qwen2.5-Coder-1.5B, the model the issue names for QLoRA, does not fit a lease: its GGUF is
1.1 GB and only 64 MiB travel per call. SmolLM2 travels in two calls, so both bitsandbytes
paths of this project run on it, through the project's own code:

  inference  `rl.adaptation.quant.load_for_inference(path, mode)` for mode bf16 (the GPU
             baseline), bnb8 (LLM.int8) and bnb4 (nf4, bf16 compute); each answers the 300
             HotpotQA test questions with the default hybrid k=5 contexts (`cite_concise`,
             greedy, 20 new tokens, batches of 32) for F1 and citation precision, and the first
             20 one at a time for single-stream latency; GPU memory after load and at peak.
  QLoRA      `rl.adaptation.generator_trainer.SFTRun` with `qlora: true, device: cuda`, LoRA
             r 16 / alpha 32 on all seven projections (q, k, v, o, gate, up, down), otherwise
             the committed `smollm2-sft` recipe (500 train questions with gold paragraphs, lr
             4e-4, batch 4, one epoch = 125 steps, valid F1 on 16 every 25 steps); the trained
             adapter on its nf4 base then answers the same 300 test questions.

Steps (as bench/gpu_grpo.py, whose cargo it starts from: SFT adapter, contexts, GGUF):

    python bench/gpu_grpo.py prepare && python bench/gpu_quant.py prepare --bnb-tar T  # here
    # device: call 1 carries .gpu_cargo/quant/{base,whl,bnb.tar.gz,pieces/p00}; call 2 p01:
    python bench/gpu_quant.py run --out $OUT
    python bench/gpu_quant.py ingest --from <device files>                      # here

Every stage is guarded: one that fails is recorded in run.json and the next still runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRPO_CARGO = Path(".gpu_cargo/grpo")
CARGO = Path(".gpu_cargo/quant")
RAW = Path(__file__).resolve().parent / "results" / "gpu_quant_raw"
MODES = ("bf16", "bnb8", "bnb4")
EVAL_N, LATENCY_N, MAX_NEW, BATCH = 300, 20, 20, 32
# gradient checkpointing off: the committed run stopped at step 50 of 125 inside the call's
# limit, and a 135M model in nf4 is nowhere near the GPU's memory
QLORA = {"qlora": True, "qlora_gradient_checkpointing": False, "device": "cuda", "lora.r": 16,
         "lora.alpha": 32,
         "lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj"],
         "train.lr": 4e-4, "eval.n": 16, "eval.every_steps": 25, "eval.max_new_tokens": 20,
         "checkpoint.every_steps": 25, "mlflow.enabled": False}
FIRST_PIECE_BYTES = 43_200_000
WHEELS = ("peft", "gguf", "pydantic", "pydantic_core", "annotated_types", "typing_inspection")


def prepare(cargo: Path, grpo_cargo: Path, bnb_tar: Path) -> None:
    """From bench/gpu_grpo.py's cargo: the SFT adapter, the test contexts, the gold-paragraph
    train questions and the GGUF (cut again: call 1 carries this folder's base, the wheels and
    bitsandbytes, only its CUDA 13 library: the wheel's other builds are 150 MB); plus the
    valid questions of the SFT recipe's eval and the wheels the device lacks."""
    import bench.common  # noqa: F401
    from bench.gpu_grpo import _gz_read, _gz_write
    from rl.adaptation.sft_data import hotpot_split, save_examples

    src = grpo_cargo / "base"
    if not (src / "plan.json").exists():
        raise SystemExit(f"{grpo_cargo}: run `python bench/gpu_grpo.py prepare` first")
    if cargo.exists():
        shutil.rmtree(cargo)
    (cargo / "whl").mkdir(parents=True)
    base = cargo / "base"
    shutil.copytree(src / "sft_adapter", base / "sft_adapter")
    shutil.copy2(src / f"contexts-test-{EVAL_N}.json.gz", base)
    _gz_write(base / "train_gold.json.gz", [r for r in _gz_read(src / "grpo_train.json.gz")
                                            if r.get("meta", {}).get("contexts") != "hybrid"])
    save_examples(hotpot_split("valid", 16), base / "valid16.jsonl")
    shutil.copy2(bnb_tar, cargo / "bnb.tar.gz")
    for w in sorted((grpo_cargo / "whl").glob("*.whl")):
        if w.name.split("-")[0] in WHEELS:
            shutil.copy2(w, cargo / "whl" / w.name)
    man = json.loads((src / "pieces.json").read_text())
    data = b"".join((grpo_cargo / "pieces" / p).read_bytes() for p in man["pieces"])
    assert hashlib.sha256(data).hexdigest() == man["sha256"]
    (cargo / "pieces").mkdir()
    (cargo / "pieces" / "p00").write_bytes(data[:FIRST_PIECE_BYTES])
    (cargo / "pieces" / "p01").write_bytes(data[FIRST_PIECE_BYTES:])
    (base / "pieces.json").write_text(json.dumps(man, indent=1))
    size = sum(p.stat().st_size for p in cargo.rglob("*") if p.is_file() and "pieces" not in
               p.parts)
    print(f"[prepare] {cargo} without pieces: {size / 1e6:.2f} MB; pieces "
          f"{FIRST_PIECE_BYTES / 1e6:.2f} + {(len(data) - FIRST_PIECE_BYTES) / 1e6:.2f} MB",
          flush=True)


# ----------------------------------------------------------------------------- run (device)
def _examples(part: dict):
    from rag.types import Context
    from rl.adaptation.sft_data import SFTExample

    return [SFTExample(i, q, tuple(Context(**c) for c in cs), "", "hotpotqa", tuple(a),
                       tuple(gp))
            for i, q, cs, a, gp in zip(part["ids"], part["questions"], part["contexts"],
                                       part["answers"], part["gold_positions"], strict=True)]


def _answer(model, tok, examples, batch: int) -> tuple[list[dict], float]:
    from rl.adaptation.generator_model import generate_answers

    t0 = time.perf_counter()
    gens = generate_answers(model, tok, [e.question for e in examples],
                            [list(e.contexts) for e in examples], "cite_concise", MAX_NEW, batch)
    return gens, time.perf_counter() - t0


def _scores(gens, examples) -> dict:
    from rag.metrics.qa import best_em_f1

    f1 = [best_em_f1(g["text"], e.answers)[1] for g, e in zip(gens, examples, strict=True)]
    prec = [len(set(g["citations"]) & set(e.gold_positions)) / len(set(g["citations"]))
            if g["citations"] else 0.0 for g, e in zip(gens, examples, strict=True)]
    return {"f1": f1, "citation_precision": prec, "answers": [g["raw"] for g in gens],
            "tokens_out": [g["tokens_out"] for g in gens]}


CPU_CHECK = {"qlora": False, "device": "cpu", "train.max_steps": 2, "eval.n": 2,
             "eval.every_steps": 1}


def run(cargo: Path, out: Path, work: Path, n: int,
        cpu_check: bool = False) -> None:
    """The device step. `cpu_check`: the same code here on CPU (fp32 instead of the GPU modes,
    a 2-step plain LoRA instead of QLoRA), to test everything but bitsandbytes itself."""
    import torch

    from bench.gpu_grpo import _assemble, _base_from_gguf, _gz_read, _gz_write, _Log
    from rl.adaptation.generator_export import merge_adapter

    class Log(_Log):  # run.json, and the answers so far, after every stage
        def flush(self) -> None:
            super().flush()
            _gz_write(self.out / "answers.json.gz", results)

    cuda = not cpu_check
    results: dict = {}
    log = Log(out)
    info = log.info
    info.update({"device": torch.cuda.get_device_name(0) if cuda else "cpu",
                 "torch": torch.__version__})
    stage, guarded, flush = log.stage, log.guarded, log.flush

    import peft
    import transformers

    info["versions"] = {"transformers": transformers.__version__, "peft": peft.__version__}
    if cuda:
        import bitsandbytes

        info["versions"]["bitsandbytes"] = bitsandbytes.__version__
    t0 = time.perf_counter()
    base = _base_from_gguf(_assemble(cargo, work), work / "base")
    sft = merge_adapter(cargo / "base" / "sft_adapter", work / "sft", base_path=base)
    stage("load/base+sft", t0)
    test = _examples(_gz_read(cargo / "base" / f"contexts-test-{EVAL_N}.json.gz"))[:n]

    def one_mode(mode: str) -> None:
        from rl.adaptation.quant import load_for_inference

        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated() if cuda else 0
        t0 = time.perf_counter()
        model, tok = load_for_inference(sft, mode)
        load_s = time.perf_counter() - t0
        weights_mb = (torch.cuda.memory_allocated() - base_alloc) / 2**20 if cuda else 0.0
        peak = (lambda: (torch.cuda.max_memory_allocated() - base_alloc) / 2**20) if cuda \
            else (lambda: 0.0)
        _answer(model, tok, test[:1], 1)  # warm-up
        single, single_s = _answer(model, tok, test[:LATENCY_N], 1)
        gens, secs = _answer(model, tok, test, BATCH)
        toks = sum(g["tokens_out"] for g in single)
        results[mode] = _scores(gens, test)
        stage(f"quant/{mode}", t0, load_s=round(load_s, 2), gpu_weights_mb=round(weights_mb, 1),
              gpu_peak_mb=round(peak(), 1),
              ms_per_token_single=round(1000 * single_s / max(toks, 1), 2),
              ms_per_answer_single=round(1000 * single_s / len(single), 1),
              batched_s=round(secs, 2), n=len(test),
              f1=round(sum(results[mode]["f1"]) / len(test), 4))
        del model
        if cuda:
            torch.cuda.empty_cache()

    for mode in (MODES if cuda else ("fp32",)):
        guarded(f"quant/{mode}", lambda mode=mode: one_mode(mode))

    def qlora() -> None:
        from rl.adaptation.generator_config import GeneratorSFTConfig
        from rl.adaptation.generator_trainer import SFTRun
        from rl.adaptation.sft_data import SFTExample, load_examples

        train = [SFTExample.from_dict(r)
                 for r in _gz_read(cargo / "base" / "train_gold.json.gz")]
        cfg = GeneratorSFTConfig().replace(base_model=str(base),
                                           **{**QLORA, **(CPU_CHECK if cpu_check else {})})
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        runner = SFTRun(cfg, work / "qlora", train,
                        load_examples(cargo / "base" / "valid16.jsonl"),
                        base_path=base, log=print)
        summary = runner.train()
        info["qlora"] = {k: v for k, v in summary.items()
                         if k in ("steps_done", "n_train", "train_seconds", "tokens_per_s",
                                  "best_step", "best_eval_f1", "final_loss", "lora_r",
                                  "lora_alpha", "target_modules", "qlora", "lr")}
        info["qlora"]["history"] = [{k: r[k] for k in ("step", "loss", "eval_f1") if k in r}
                                    for r in runner_history(work / "qlora")]
        train_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
        gens, secs = _answer(runner.model, runner.tokenizer, test, BATCH)
        results["qlora"] = _scores(gens, test)
        stage("qlora", t0, steps=summary["steps_done"], train_s=round(summary["train_seconds"], 1),
              gpu_peak_train_mb=round(train_peak, 1), test_s=round(secs, 2),
              f1=round(sum(results["qlora"]["f1"]) / len(test), 4))
        last = sorted((work / "qlora" / "checkpoints").glob("step-*"))[-1]
        info["qlora"]["adapter_sha256"] = hashlib.sha256(
            (last / "adapter_model.safetensors").read_bytes()).hexdigest()  # 20 MB: not returned
        flush()

    guarded("qlora", qlora)
    flush()


def runner_history(run_dir: Path) -> list[dict]:
    """The SFT run's per-step records (loss, eval_f1 where evaluated) from its last checkpoint."""
    import torch

    latest = run_dir / "checkpoints" / "latest"
    if not latest.exists():
        return []
    state = torch.load(latest / "trainer_state.pt", weights_only=False)["state"]
    return state.get("history", [])


# ----------------------------------------------------------------------------- ingest (here)
def ingest(src: Path, quick: bool) -> None:
    import numpy as np

    from bench.common import make_meta, metric_row, optional_data, plain_row, write_results
    from bench.gpu_grpo import _gz_read, results_table
    from rag.corpus.loaders import HOTPOTQA_FILE

    info = json.loads((src / "run.json").read_text())
    res = _gz_read(src / "answers.json.gz")
    if not quick:
        RAW.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "answers.json.gz"):
            shutil.copy2(src / name, RAW / name)
        if (src / "run.log").exists():  # 7 MB, mostly one bitsandbytes warning repeated
            keep = [x for x in (src / "run.log").read_text(errors="replace").splitlines()
                    if x.startswith(("[run]", "[sft]", "Traceback")) or "Error" in x]
            (RAW / "run.log.excerpt").write_text("\n".join(keep) + "\n")
    ds = f"hotpotqa/test/hybrid-k5 ({info['device']})"
    rows, st = [], info["stages"]
    label = {"bf16": "smollm2-sft:bf16", "bnb8": "smollm2-sft:bnb8", "bnb4": "smollm2-sft:bnb4",
             "qlora": "smollm2-qlora:nf4"}
    for key in (*MODES, "qlora"):
        if key not in res:
            continue
        r = res[key]
        rows.append(metric_row(ds, label[key], "answer_f1", r["f1"]))
        rows.append(metric_row(ds, label[key], "citation_precision", r["citation_precision"]))
        s = st.get(f"quant/{key}") or st.get(key) or {}
        for m in ("gpu_weights_mb", "gpu_peak_mb", "ms_per_token_single", "ms_per_answer_single",
                  "load_s", "gpu_peak_train_mb", "train_s"):
            if m in s:
                rows.append(plain_row(ds, label[key], m, s[m],
                                      LATENCY_N if "single" in m else len(r["f1"])))
    for key in ("bnb8", "bnb4", "qlora"):
        if key in res and "bf16" in res:
            d = np.asarray(res[key]["f1"]) - np.asarray(res["bf16"]["f1"])
            rows.append(metric_row(ds, f"{label[key]} - {label['bf16']}", "delta_answer_f1", d))
            rows[-1]["changed"] = int(np.sum(np.abs(d) > 1e-12))
    meta = make_meta(seed=0, datasets=optional_data({"hotpotqa": HOTPOTQA_FILE}), extra={
        "quick": quick, "device_run": {k: info.get(k) for k in ("device", "torch", "versions",
                                                                 "errors", "qlora")},
        "stages": st})
    lines = [f"Prepared here, run on the lent device, ingested here (`python bench/gpu_quant.py "
             f"ingest --from DIR`): device {info['device']}, torch {info['torch']}, "
             f"{info.get('versions')}; the device's files are in `bench/results/gpu_quant_raw/`.",
             "", *results_table(rows)]
    q = info.get("qlora")
    if q:
        lines += ["", f"QLoRA run: {q}"]
    partial = qlora_progress(src / "run.log") if not q and (src / "run.log").exists() else []
    if partial:  # the stage did not finish: what its log says it reached
        for r in partial:
            rows.append(plain_row(f"hotpotqa/valid[:16]/gold ({info['device']})",
                                  f"{label['qlora']}@step{r['step']}", "eval_f1", r["eval_f1"],
                                  16))
        lines += ["", "QLoRA did not finish inside the call's time limit; its log reached step "
                      f"{partial[-1]['step']} of 125: " + ", ".join(
                          f"step {r['step']} loss {r['loss']:.3f} valid F1 (16) "
                          f"{r['eval_f1']:.3f}" for r in partial) + "."]
    if info.get("errors"):
        lines += ["", "Stages that failed on the device: " + "; ".join(info["errors"])]
    write_results("gpu_quant", rows, meta, "bitsandbytes on a lent GPU", "\n".join(lines))
    print("\n".join(lines))


def qlora_progress(log: Path) -> list[dict]:
    """The `[sft] step N/T loss L ... eval_f1 F` lines SFTRun printed (a stage cut short)."""
    import re

    pat = re.compile(r"\[sft\] step (\d+)/(\d+) loss ([0-9.]+) .*eval_f1 ([0-9.]+)")
    return [{"step": int(m[1]), "total": int(m[2]), "loss": float(m[3]),
             "eval_f1": float(m[4])}
            for m in pat.finditer(log.read_text(errors="replace"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--cargo", type=Path, default=CARGO)
    p.add_argument("--grpo-cargo", type=Path, default=GRPO_CARGO)
    p.add_argument("--bnb-tar", type=Path, required=True,
                   help="tar.gz of the bitsandbytes package (and dist-info) to unpack there")
    r = sub.add_parser("run")
    r.add_argument("--cargo", type=Path, default=CARGO)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_quant_out")))
    r.add_argument("--work", type=Path, default=Path("/tmp/gpu_quant"))
    r.add_argument("-n", type=int, default=EVAL_N, help="test questions (fewer: a code check)")
    r.add_argument("--cpu-check", action="store_true",
                   help="run the same code on CPU (fp32, a 2-step plain LoRA): a code check")
    i = sub.add_parser("ingest")
    i.add_argument("--from", dest="src", type=Path, required=True)
    i.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.cargo, a.grpo_cargo, a.bnb_tar)
    elif a.cmd == "run":
        from bench.gpu_grpo import fresh_run_dirs

        fresh_run_dirs(a.out, a.work)
        run(a.cargo, a.out, a.work, a.n, a.cpu_check)
    else:
        ingest(a.src, a.quick)


if __name__ == "__main__":
    main()
