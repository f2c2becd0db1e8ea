"""Online RL of the generator at GPU size (issue 21 items 4 and 5): TRL GRPO of SmolLM2-135M
from `smollm2-sft`, on a lent GPU, against that SFT policy on the same HotpotQA questions.

The CPU run (`docs/adaptation.md`: 30 steps x 2 prompts x 4 samples in 47 minutes) moved no test
answer; this is the run that code path was written for: hundreds of steps, 16 prompts x 8
samples a step. The device has neither this project's stack (Ray, tantivy, FAISS) nor a
network, and only 64 MiB travel per call, so the work is split in three steps, as
`bench/gpu_models.py`:

  prepare  (here, CPU)   the SFT adapter (`smollm2-sft@best`'s checkpoint), the GRPO prompts
                         (the 500 HotpotQA train questions, each with gold paragraphs + one
                         distractor and with the default hybrid top 5: `teacher_examples`),
                         the valid/test questions with their hybrid k=5 contexts (the parts
                         `bench/generator_adaptation.py` evaluates on), the settings, and the
                         SmolLM2 GGUF cut in pieces that fit a call each -> .gpu_cargo/grpo/
                         (+ wheels).
  run      (device)      rebuilds base -> merged SFT, runs `rl.adaptation.grpo.run_grpo` under a
                         wall-clock budget, merges every `--eval-every`-th checkpoint and
                         answers valid (300) with each and with the SFT policy through
                         `bench.generator_adaptation.eval_systems(device="cuda")`; the checkpoint
                         with the highest valid F1 (ties: the earliest) and the SFT policy then
                         answer test (300). Writes run.json, the two eval parts and the chosen
                         and last adapters (adapters.tar) under $OUT, after every stage.
  ingest   (here, CPU)   copies the device's outputs to bench/results/gpu_grpo_<run>_raw/,
                         rebuilds and registers the chosen GRPO model here (`smollm2-grpo-gpu`,
                         local registry) so `bench/generator_adaptation.py --section eval` answers
                         with it on CPU, and writes bench/results/gpu_grpo.{json,md}.

Fixed before the run (pre-registered; nothing here was tuned on valid or test): the settings in
SETTINGS (run 2; run 1's are RUN1), the selection rule above, and the acceptance row
`smollm2-grpo - smollm2-sft` delta_answer_f1 (paired bootstrap over the 300 test questions,
target CI above 0 and +0.02).

    python bench/gpu_grpo.py prepare                       # here
    # device: call 1 carries .gpu_cargo/grpo/{base,whl,pieces/p00}, each later call the next
    # piece (prepare prints how many); the last one also runs
    python bench/gpu_grpo.py run --out $OUT
    python bench/gpu_grpo.py ingest --from <device files>  # here
    python bench/gpu_grpo.py run --device cpu --smoke      # the device step, tiny, on CPU
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_models import _read_gz as _gz_read  # noqa: E402
from bench.gpu_models import _write_gz as _gz_write  # noqa: E402

CARGO = Path(".gpu_cargo/grpo")
CARGO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
SMOL = "smollm2-135m-instruct"
EVAL_N = 300
# rl.adaptation.grpo.GRPOSettings overrides, fixed before each run. Run 1 (stop 41,
# bench/results/gpu_grpo_run1.md, raw files in gpu_grpo_raw/): 49 steps in its 240 s, test
# +0.011 [-0.007, +0.030], KL to the SFT policy still ~0.03. Run 2 (bench/results/gpu_grpo.md)
# changes, from run 1's train log alone: twice the learning rate (the policy had barely moved)
# and a longer budget. Its first try also loaded the policy in bf16 with micro-batches of 64
# (RUN2_FIRST_TRY) and failed; the second try (SETTINGS) keeps run 1's fp32 numerics. A CUDA
# out-of-memory error halves the micro-batch for the budget left (recorded).
RUN1 = {
    "steps": 400, "prompts_per_step": 16, "num_generations": 8, "micro_batch": 32,
    "max_completion_length": 24,
    "temperature": 0.9, "beta": 0.04, "lr": 5e-5, "lora_r": 8, "lora_alpha": 16,
    "cite_weight": 0.5, "save_steps": 25, "keep_checkpoints": 20, "max_seconds": 240.0,
    "eval_n": 0, "seed": 0}
SETTINGS = {**RUN1, "lr": 1e-4, "micro_batch": 32, "max_seconds": 300.0, "precision": "fp32"}
RUN2_FIRST_TRY = {**RUN1, "lr": 1e-4, "micro_batch": 64, "max_seconds": 330.0}
"""Run 2's first try (bf16 weights and autocast): a NaN gradient at step 46 of 330 s, then a
CUDA assert in sampling; nothing was evaluated (bench/results/gpu_grpo_run2_raw/first-try.*).
The second try keeps run 1's numerics (fp32, micro-batches of 32) and its own lr and budget."""
RUN = "run2"
RAW = RESULTS / "gpu_grpo_run2_raw"
EVAL_EVERY = 25
CALL_BYTES = 63 * 2**20
"""What one device call may carry (64 MiB: the working tree and the carried paths), less 1 MiB."""


def _tree_bytes() -> int:
    """Bytes of the working tree that travels with every call: tracked files and untracked
    files git does not ignore."""
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True, cwd=CARGO_ROOT).stdout.decode()
    return sum((CARGO_ROOT / n).stat().st_size for n in names.split("\0")
               if n and (CARGO_ROOT / n).is_file())


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) if d.exists() else 0


BASE_LABEL, GPU_LABEL, CPU_N = "smollm2-sft", "smollm2-grpo-gpu", 100
SMOKE = {"steps": 2, "prompts_per_step": 2, "num_generations": 2, "micro_batch": 2,
         "max_completion_length": 6,
         "save_steps": 1, "keep_checkpoints": 5, "max_seconds": 0.0, "eval_n": 0}


# ----------------------------------------------------------------------------- prepare (here)
def prepare(cargo: Path, sft_ref: str, train_n: int) -> None:
    import bench.common  # noqa: F401  (process defaults: threads, offline HF)
    from bench.generator_adaptation import resolve_system, split_contexts
    from rag.models import default_registry
    from rl.adaptation.teacher import teacher_examples

    base = cargo / "base"
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    if (Path(sft_ref) / "adapter_config.json").exists():  # an adapter folder itself (smoke)
        adapter, merged = Path(sft_ref), None
        meta = json.loads((adapter / "meta.json").read_text())
    else:
        merged, meta = resolve_system(sft_ref)
        adapter = Path(meta["adapter"])
    (base / "sft_adapter").mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json", "meta.json"):
        shutil.copy2(adapter / name, base / "sft_adapter" / name)
    (base / "sft_adapter" / "ragpilot_meta.json").write_text(json.dumps(meta, indent=1))
    rows = []
    for mode in ("gold", "hybrid"):
        rows += [e.to_dict() for e in teacher_examples(mode, train_n)]
    _gz_write(base / "grpo_train.json.gz", rows)
    for split in ("valid", "test"):
        _gz_write(base / f"contexts-{split}-{EVAL_N}.json.gz", split_contexts(split, EVAL_N))
    gguf = default_registry().get(SMOL).resolve()
    data = gguf.read_bytes()
    # each call carries the working tree too (64 MiB in all): the first piece travels with the
    # base folder and the wheels, each later one alone (written below, so base's size is
    # known but for pieces.json and plan.json, a few hundred bytes)
    room = CALL_BYTES - _tree_bytes()
    first = room - _dir_bytes(base) - _dir_bytes(cargo / "whl") - 2**16
    if first <= 0:
        raise SystemExit(f"no room for a GGUF piece beside the tree, base and wheels "
                         f"({room / 2**20:.1f} MiB a call)")
    cuts = [0, first, *range(first + room, len(data), room), len(data)]
    pieces = cargo / "pieces"
    if pieces.exists():
        shutil.rmtree(pieces)
    pieces.mkdir()
    names = [f"p{i:02d}" for i in range(len(cuts) - 1)]
    for name, a, b in zip(names, cuts[:-1], cuts[1:], strict=True):
        (pieces / name).write_bytes(data[a:b])
    (base / "pieces.json").write_text(json.dumps({
        "pieces": names, "size": len(data), "dest": f"{SMOL}/{gguf.name}",
        "sha256": hashlib.sha256(data).hexdigest()}, indent=1))
    (base / "plan.json").write_text(json.dumps({
        "sft": {"ref": sft_ref, "merged": str(merged), "adapter": str(adapter),
                "eval": meta.get("eval"), "step": meta.get("step")},
        "settings": SETTINGS, "eval_every": EVAL_EVERY, "eval_n": EVAL_N,
        "train_prompts": len(rows), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ")}, indent=1))
    size = sum(p.stat().st_size for p in base.rglob("*") if p.is_file())
    print(f"[prepare] base {size / 2**20:.1f} MiB, pieces "
          f"{[round(p.stat().st_size / 2**20, 1) for p in sorted((cargo / 'pieces').iterdir())]}"
          f" MiB, {len(rows)} GRPO prompts", flush=True)


# ----------------------------------------------------------------------------- run (device)
class _Log:
    """run.json under $OUT, rewritten after every stage, so a call cut at its time limit still
    returns what it finished."""

    def __init__(self, out: Path):
        self.out, self.info = out, {"stages": {}, "errors": []}

    def stage(self, name: str, t0: float, **extra) -> None:
        self.info["stages"][name] = {"seconds": round(time.perf_counter() - t0, 2), **extra}
        print(f"[run] {name}: {self.info['stages'][name]}", flush=True)
        self.flush()

    def flush(self) -> None:
        (self.out / "run.json").write_text(json.dumps(self.info, indent=1, default=str))

    def guarded(self, name: str, fn):
        """`fn()`, or None with the error recorded: one failed stage must not lose the others."""
        try:
            return fn()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            self.info["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            self.flush()
            return None


def fresh_run_dirs(out: Path, work: Path) -> None:
    """$OUT kept (the tool empties it), the work folder emptied: a re-run starts clean."""
    out.mkdir(parents=True, exist_ok=True)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)


def results_table(rows: list[dict]) -> list[str]:
    """The rows as the other generator benchmarks print them."""
    from bench.generator_adaptation import _rows_table

    return _rows_table(rows, dataset=True)


def _assemble(cargo: Path, work: Path) -> Path:
    """The GGUF from its pieces (concatenated in order), checked against its sha256."""
    man = json.loads((cargo / "base" / "pieces.json").read_text())
    missing = [p for p in man["pieces"] if not (cargo / "pieces" / p).exists()]
    if missing:
        raise SystemExit(f"GGUF pieces missing: {missing} (each travels in its own call)")
    f = work / "gguf" / man["dest"]
    f.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with f.open("wb") as out:
        for p in man["pieces"]:
            buf = (cargo / "pieces" / p).read_bytes()
            h.update(buf)
            out.write(buf)
    if h.hexdigest() != man["sha256"] or f.stat().st_size != man["size"]:
        raise SystemExit(f"{f}: sha256 mismatch after assembly")
    return f


def _base_from_gguf(gguf: Path, out: Path) -> Path:
    """The fp32 HF folder `rag.generation.local.ensure_converted` makes from the same GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def train_with_fallback(train, s, info: dict, clean) -> dict:
    """`train(s)`; on a CUDA out-of-memory error, `clean()` and once more with half the
    micro-batch for the wall-clock budget left (what happened goes to info["oom_fallback"]).
    The retry runs outside the handler, whose traceback would keep the failed trainer's GPU
    memory alive."""
    import gc

    import torch

    t0 = time.perf_counter()
    try:
        return train(s)
    except torch.OutOfMemoryError as e:
        info["oom_fallback"] = {"micro_batch": s.micro_batch, "to": s.micro_batch // 2,
                                "after_s": round(time.perf_counter() - t0, 1),
                                "error": str(e)[:300]}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    clean()
    left = max(s.max_seconds - (time.perf_counter() - t0), 60.0) if s.max_seconds else 0.0
    return train(s.replace(micro_batch=s.micro_batch // 2, max_seconds=left))


def run(cargo: Path, out: Path, device: str, smoke: bool, work: Path,
        max_seconds: float | None, policy_dir: Path | None = None) -> None:
    """The device step (module docstring). `policy_dir`: an HF folder used as the SFT policy
    instead of base GGUF + SFT adapter (a smoke run on a tiny model, before the pieces are all
    there)."""
    import torch

    log = _Log(out)
    base_dir = cargo / "base"
    plan = json.loads((base_dir / "plan.json").read_text())
    log.info.update({"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                     "torch": torch.__version__, "python": sys.version.split()[0],
                     "plan": plan})
    import peft
    import transformers
    import trl

    log.info["versions"] = {"transformers": transformers.__version__, "trl": trl.__version__,
                            "peft": peft.__version__}
    log.info["run"] = RUN
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # the eval harness reads its question parts from <cache>/bench/generator_adaptation
    os.environ["RAGPILOT_CACHE"] = str(work / "cache")
    parts = work / "cache" / "bench" / "generator_adaptation"
    parts.mkdir(parents=True, exist_ok=True)
    n = 4 if smoke else EVAL_N
    for split in ("valid", "test"):
        part = _gz_read(base_dir / f"contexts-{split}-{EVAL_N}.json.gz")
        part = {k: v[:n] if isinstance(v, list) else v for k, v in part.items()}
        (parts / f"contexts-{split}-{n}.json").write_text(json.dumps(part))
    from bench.generator_adaptation import eval_systems
    from rl.adaptation.generator_export import merge_adapter
    from rl.adaptation.grpo import GRPOSettings, run_grpo
    from rl.adaptation.sft_data import SFTExample

    t0 = time.perf_counter()
    if policy_dir is not None:
        sft = policy_dir
    else:
        gguf = _assemble(cargo, work)
        base = _base_from_gguf(gguf, work / "base")
        sft = merge_adapter(base_dir / "sft_adapter", work / "sft", base_path=base)
    log.stage("load/base+sft", t0, policy=str(sft))

    settings = {**SETTINGS, **(SMOKE if smoke else {})}
    if max_seconds is not None:
        settings["max_seconds"] = max_seconds
    rows = _gz_read(base_dir / "grpo_train.json.gz")
    examples = [SFTExample.from_dict(r) for r in (rows[:4] if smoke else rows)]
    s = GRPOSettings().replace(**settings, n_train=len(examples))
    t0 = time.perf_counter()
    summary = train_with_fallback(lambda st: run_grpo(sft, work / "grpo", st, examples,
                                                      merge=False),
                                  s, log.info, lambda: shutil.rmtree(work / "grpo",
                                                                     ignore_errors=True))
    train_log = [json.loads(x) for x in (work / "grpo" / "train_log.jsonl").read_text()
                 .splitlines()]
    log.info["grpo"] = {k: v for k, v in summary.items() if k != "eval"}
    log.info["train_log"] = train_log
    log.stage("grpo/train", t0, steps=summary["steps_done"],
              stopped_by_clock_at=summary.get("stopped_by_clock_at"))
    if device == "cuda":
        log.info["peak_gpu_mb_train"] = round(torch.cuda.max_memory_allocated() / 2**20)

    every = 1 if smoke else EVAL_EVERY
    cks = sorted((work / "grpo" / "trainer").glob("checkpoint-*"),
                 key=lambda p: int(p.name.split("-")[-1]))
    last = int(cks[-1].name.split("-")[-1]) if cks else 0
    chosen_cks = [c for c in cks if int(c.name.split("-")[-1]) % every == 0
                  or int(c.name.split("-")[-1]) == last]
    systems = {"smollm2-sft": str(sft)}
    t0 = time.perf_counter()
    for c in chosen_cks:
        systems[f"grpo-{c.name.split('-')[-1]}"] = str(
            merge_adapter(c, work / f"merged-{c.name}", base_path=sft))
    log.stage("grpo/merge", t0, checkpoints=[c.name for c in chosen_cks])
    t0 = time.perf_counter()
    valid = eval_systems(systems, "valid", n, device=device)
    f1 = {k: sum(v["f1"]) / len(v["f1"]) for k, v in valid["systems"].items()}
    grpo_f1 = {k: v for k, v in f1.items() if k.startswith("grpo-")}
    best = max(grpo_f1, key=lambda k: (grpo_f1[k], -int(k.split("-")[1]))) if grpo_f1 else None
    log.info["valid_f1"], log.info["chosen"] = f1, best
    shutil.copy2(parts / f"eval-valid-{n}{'' if device == 'cpu' else '-' + device}.json",
                 out / "eval-valid.json")
    log.stage("eval/valid", t0, n=n, chosen=best)
    if best is None:
        return
    t0 = time.perf_counter()
    eval_systems({"smollm2-sft": systems["smollm2-sft"], "smollm2-grpo": systems[best]},
                 "test", n, device=device)
    shutil.copy2(parts / f"eval-test-{n}{'' if device == 'cpu' else '-' + device}.json",
                 out / "eval-test.json")
    log.stage("eval/test", t0, n=n)
    with tarfile.open(out / "adapters.tar", "w") as tar:
        for c in {best, f"grpo-{last}"}:
            ck = work / "grpo" / "trainer" / f"checkpoint-{c.split('-')[1]}"
            for name in ("adapter_model.safetensors", "adapter_config.json"):
                tar.add(ck / name, arcname=f"{c}/{name}")
    heavy = sorted(m for m in ("ray", "tantivy", "faiss", "mlflow") if m in sys.modules)
    log.info["heavy_modules_imported"] = heavy
    log.flush()


# ----------------------------------------------------------------------------- ingest (here)
def ingest(src: Path, quick: bool) -> None:
    import numpy as np

    from bench.common import make_meta, metric_row, optional_data, write_results
    from rag.corpus.loaders import HOTPOTQA_FILE

    info = json.loads((src / "run.json").read_text())
    valid = json.loads((src / "eval-valid.json").read_text())
    test = json.loads((src / "eval-test.json").read_text())
    if not quick:
        RAW.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "eval-valid.json", "eval-test.json"):
            shutil.copy2(src / name, RAW / name)
    ds_v = f"hotpotqa/valid/hybrid-k5 ({info['device']}, bf16)"
    ds_t = f"hotpotqa/test/hybrid-k5 ({info['device']}, bf16)"
    rows = []
    for label, sysd in valid["systems"].items():
        rows.append(metric_row(ds_v, label, "answer_f1", sysd["f1"]))
    for label, sysd in test["systems"].items():
        rows.append(metric_row(ds_t, label, "answer_f1", sysd["f1"]))
        rows.append(metric_row(ds_t, label, "citation_precision", sysd["citation_precision"]))
        # the cost side: same model and prompt, so generated tokens are the only thing to move
        rows.append(metric_row(ds_t, label, "tokens_out", sysd["tokens_out"]))
    d = (np.asarray(test["systems"]["smollm2-grpo"]["f1"])
         - np.asarray(test["systems"]["smollm2-sft"]["f1"]))
    dp = (np.asarray(test["systems"]["smollm2-grpo"]["citation_precision"])
          - np.asarray(test["systems"]["smollm2-sft"]["citation_precision"]))
    rows.append(metric_row(ds_t, "smollm2-grpo - smollm2-sft", "delta_citation_precision", dp))
    rows.append(metric_row(ds_t, "smollm2-grpo - smollm2-sft", "delta_answer_f1", d))
    rows[-1]["changed"] = int(np.sum(np.abs(d) > 1e-12))
    cpu_lines = []
    cpu = cpu_part(CPU_N)
    if cpu is not None:  # the committed CPU protocol (bench/generator_adaptation.py --section eval)
        ds_c = f"hotpotqa/test[:{CPU_N}]/hybrid-k5 (cpu, fp32)"
        for label in (BASE_LABEL, GPU_LABEL):
            rows.append(metric_row(ds_c, label, "answer_f1", cpu["systems"][label]["f1"]))
            rows.append(metric_row(ds_c, label, "citation_precision",
                                   cpu["systems"][label]["citation_precision"]))
            rows.append(metric_row(ds_c, label, "tokens_out", cpu["systems"][label]["tokens_out"]))
        dc = (np.asarray(cpu["systems"][GPU_LABEL]["f1"])
              - np.asarray(cpu["systems"][BASE_LABEL]["f1"]))
        rows.append(metric_row(ds_c, f"{GPU_LABEL} - {BASE_LABEL}", "delta_answer_f1", dc))
        rows[-1]["changed"] = int(np.sum(np.abs(dc) > 1e-12))
        r = rows[-1]
        cpu_lines = [f"On CPU with the committed protocol (the chosen checkpoint merged here onto "
                     f"the local `{BASE_LABEL}` and registered as `{GPU_LABEL}`; first {CPU_N} "
                     f"test questions, fp32, `python bench/generator_adaptation.py --section eval "
                     f"--eval-n {CPU_N} --system {BASE_LABEL}={BASE_LABEL}@best --system "
                     f"{GPU_LABEL}={GPU_LABEL}@best`): {r['value']:+.4f} [{r['ci_low']:+.4f}, "
                     f"{r['ci_high']:+.4f}], F1 changed on {r['changed']} of {r['n']}.", ""]
    g = info.get("grpo", {})
    tl = [r for r in info.get("train_log", []) if "reward" in r]
    meta = make_meta(seed=0, datasets=optional_data({"hotpotqa": HOTPOTQA_FILE}), extra={
        "quick": quick, "device_run": {k: info.get(k) for k in (
            "device", "torch", "versions", "chosen", "valid_f1", "peak_gpu_mb_train",
            "oom_fallback", "run")},
        "stages": info.get("stages"), "plan": info.get("plan")})
    lines = ["Prepared here, run on the lent device, ingested here "
             f"(`python bench/gpu_grpo.py ingest --from DIR`): device {info['device']}, torch "
             f"{info['torch']}, {info.get('versions')}; the device's files are in "
             f"`bench/results/{RAW.name}/`. Run 1 (stop 41, lr 5e-5, 240 s, micro-batch 32, "
             "fp32 weights): `bench/results/gpu_grpo_run1.md`.", "",
             *(["Run 2's first try (bf16 weights and autocast, micro-batches of 64, lr 1e-4, "
                "330 s) reached a NaN gradient norm at step 46 and stopped on a CUDA assert in "
                "sampling; nothing was evaluated (`first-try.*` in the raw folder). The run "
                "below is the second try, with run 1's fp32 numerics, fixed before it ran.", ""]
               if (RAW / "first-try.run.json").exists() else []),
             *([f"Out of memory at micro-batch {info['oom_fallback']['micro_batch']}: fell "
                f"back to {info['oom_fallback']['to']} after "
                f"{info['oom_fallback']['after_s']} s."] if info.get("oom_fallback") else []),
             f"GRPO: {g.get('steps_done')} steps in {g.get('seconds', 0):.0f} s "
             f"(wall-clock budget {g.get('settings', {}).get('max_seconds')} s; stopped by it at "
             f"step {g.get('stopped_by_clock_at')}), settings {g.get('settings')}. Prompts: "
             f"the {g.get('settings', {}).get('n_train')} built by `prepare` (the train "
             "questions with gold paragraphs + one distractor, 600 characters each, and with the "
             "hybrid top 5); `n_distractors` and `max_context_chars` above apply only when "
             "`run_grpo` builds its own prompts.",
             f"Training reward (F1 + 0.5 x citation precision, group mean): first "
             f"{tl[0]['reward']:.3f}, last {tl[-1]['reward']:.3f}, mean of the last 10 "
             f"{np.mean([r['reward'] for r in tl[-10:]]):.3f}." if tl else "No reward logged.",
             f"Checkpoint chosen on valid (highest F1, ties earliest): `{info.get('chosen')}`.",
             "", *results_table(rows)]
    d = next(r for r in rows if r["dataset"] == ds_t and r["metric"] == "delta_answer_f1")
    verdict = "met" if d["ci_low"] > 0 and d["value"] >= 0.02 else "missed"
    lines += ["", f"Target `smollm2-grpo - smollm2-sft` delta_answer_f1 with CI above 0 and "
                  f"+0.02: **{verdict}** ({d['value']:+.4f} [{d['ci_low']:+.4f}, "
                  f"{d['ci_high']:+.4f}], n {d['n']}; F1 changed on {d['changed']} "
                  "questions).", "", *cpu_lines]
    write_results("gpu_grpo", rows, meta, "GRPO of SmolLM2 on a lent GPU", "\n".join(lines))
    print("\n".join(lines))


def cpu_part(n: int) -> dict | None:
    """The generator_adaptation eval part of the first `n` test questions, when it holds both
    the SFT baseline and the registered GPU GRPO model."""
    from bench.generator_adaptation import PARTS

    f = PARTS / f"eval-test-{n}.json"
    if not f.exists():
        return None
    part = json.loads(f.read_text())
    return part if {BASE_LABEL, GPU_LABEL} <= set(part["systems"]) else None


def register(src: Path, name: str = "smollm2-grpo-gpu") -> Path:
    """The chosen adapter merged onto the local `smollm2-sft@best` and registered locally."""
    from bench.generator_adaptation import resolve_system
    from rag.models import cache_dir, local_registry_path
    from rl.adaptation.generator_export import merge_adapter, write_registry_entry

    info = json.loads((src / "run.json").read_text())
    chosen = info["chosen"]
    root = cache_dir() / "runs" / "gen" / name
    with tarfile.open(src / "adapters.tar") as tar:
        tar.extractall(root / "adapters", filter="data")
    sft, _ = resolve_system(info["plan"]["sft"]["ref"])
    adapter = root / "adapters" / chosen
    (adapter / "meta.json").write_text(json.dumps({
        "method": "grpo", "base_path": str(sft), "settings": info["grpo"].get("settings"),
        "steps_done": info["grpo"].get("steps_done"), "seconds": info["grpo"].get("seconds"),
        "reward_first": info["grpo"].get("reward_first"),
        "reward_last": info["grpo"].get("reward_last"),
        "reward_mean_last10": info["grpo"].get("reward_mean_last10"),
        "device": info["device"], "checkpoint": chosen,
        "eval": {"eval_f1": info["valid_f1"][chosen]}}, indent=1))
    merged = merge_adapter(adapter, root / "merged", base_path=sft)
    write_registry_entry(local_registry_path(), name, merged)
    print(f"[register] {name} -> {merged}")
    return merged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--cargo", type=Path, default=CARGO)
    p.add_argument("--sft", default="smollm2-sft@best",
                   help="the SFT policy: registry name or merged folder (or, for a smoke run, "
                        "a SmolLM2 adapter folder)")
    p.add_argument("--train-n", type=int, default=500)
    r = sub.add_parser("run")
    r.add_argument("--cargo", type=Path, default=CARGO)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_grpo_out")))
    r.add_argument("--work", type=Path, default=Path("/tmp/gpu_grpo"))
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--smoke", action="store_true", help="2 steps, 4 questions (a code check)")
    r.add_argument("--max-seconds", type=float, help="override the GRPO wall-clock budget")
    r.add_argument("--policy-dir", type=Path, help="an HF folder as the SFT policy (smoke)")
    i = sub.add_parser("ingest")
    i.add_argument("--from", dest="src", type=Path, required=True)
    i.add_argument("--quick", action="store_true", help="write *.quick.* (a smoke run's files)")
    i.add_argument("--register", action="store_true",
                   help="also merge the chosen adapter here and register smollm2-grpo-gpu")
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.cargo, a.sft, a.train_n)
    elif a.cmd == "run":
        fresh_run_dirs(a.out, a.work)
        run(a.cargo, a.out, a.device, a.smoke, a.work, a.max_seconds, a.policy_dir)
    else:
        ingest(a.src, a.quick)
        if a.register:
            register(a.src)


if __name__ == "__main__":
    main()
