"""`ragpilot train-reranker` and `ragpilot train-generator sft|dpo|ipo|orpo`: adapt the
reranker and the generator (rl.adaptation) and register the results.

    ragpilot train-reranker --config configs/rl/reranker.yaml
    ragpilot train-reranker --set max_items=40 --set name=reranker-tiny     # a small run

train-reranker mines (query, gold, hard negatives) from the train splits, trains with
checkpoints (re-running the same command after a kill resumes), saves
`<cache>/models/<name>/v<N>/` and registers `<name>`, `<name>@v<N>`, `<name>@best` so
`rerank: cross_encoder, reranker_model: <name>` picks it. Prints a JSON summary (throughput,
eval metrics, paths).

    ragpilot train-generator sft --out runs/gen-sft                       # HotpotQA train split
    ragpilot train-generator dpo --out runs/gen-dpo --model runs/gen-sft/merged
    ragpilot train-generator grpo --out runs/gen-grpo --model runs/gen-sft/merged \
        --grpo-set steps=80     # online RL (TRL GRPO); as a Ray job: ray job submit -- <this>
    RAGPILOT_MODELS=runs/gen-sft/models.yaml ragpilot eval ... --set generator=gen-sft-gen-sft

Each run writes <out>/merged (a plain HF folder: base + LoRA merged) and <out>/models.yaml with a
`format: hf` generator entry, so the trained model is selectable by name in any RAG config, the
tuner's search space and the bandit's arms. SFT keeps `checkpoints/latest` and `checkpoints/best`
(valid-split F1) and resumes from `latest` when re-run with the same --out.
Bad config keys/values exit with code 2 naming the key. `--model` (the model dpo/ipo/orpo/grpo
start from) was called `--policy`; the old name is accepted for one release with a one-line
deprecation notice on stderr.

    ragpilot train-reranker --set max_items=40 --submit --job-address http://10.0.0.10:8265
    ragpilot train-generator sft --out /srv/runs/gen-sft --submit --gpus 1 [--wait]

`--submit` runs the same command as a Ray job (rl.common.jobs: `entrypoint_num_cpus` = --cpus,
default 1; `entrypoint_num_gpus` = --gpus when given; the working directory uploaded) and prints
the job id; `--wait` also follows it to the end and prints its logs (exit 1 unless it
SUCCEEDED).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from rag import progress
from rag.errors import ConfigError
from rag.resources import default_config
from serving.cli.common import add_set_argument, output_file, with_sets

DEFAULT_CONFIG = "configs/rl/generator_sft.yaml"


def _config(args: argparse.Namespace):
    from rl.adaptation.generator_config import DEFAULTS_PATH, GeneratorSFTConfig

    path = Path(args.config) if args.config else DEFAULTS_PATH
    return with_sets(GeneratorSFTConfig.from_yaml(path), args.set)


def build_train_examples(cfg, train_jsonl: str | None) -> list:
    """--train-jsonl, else HotpotQA train split (+ positive log rows, + teacher answers)."""
    from rl.adaptation import sft_data as sd

    if train_jsonl:
        return sd.load_examples(train_jsonl)
    d = cfg.data
    exs = sd.hotpot_split("train", d.n_train, n_distractors=d.n_distractors,
                          max_context_chars=d.max_context_chars, seed=cfg.train.seed)
    if d.log_jsonl:
        if not d.log_index:
            raise ConfigError("generator_sft.data.log_index", "needed to resolve the log's "
                                                              "context ids")
        from rag.corpus.store import Corpus

        corpus = Corpus.load(Path(d.log_index) / "corpus.jsonl")
        lookup = {p.id: p for p in corpus}
        exs += sd.log_sft_examples(d.log_jsonl, lookup, min_reward=d.log_min_reward,
                                   max_context_chars=d.max_context_chars)
    if d.teacher:
        from rag.generation.factory import make_generator

        teacher = make_generator(d.teacher)
        exs += sd.teacher_sft_examples(exs, teacher, prompt_id=cfg.prompt_id,
                                       min_f1=d.teacher_min_f1)
    return exs


def train_manifest(cfg, train_jsonl: str | None, examples: list) -> dict:
    """The dataset manifest of the examples this run trains on (rag.provenance tags): the
    --train-jsonl file, or the HotpotQA split manifest + records (+ the interaction log), each
    with its sha256."""
    from rag.corpus.loaders import sha256_file
    from rl.adaptation import sft_data as sd

    if train_jsonl:
        inputs = [{"path": str(train_jsonl), "sha256": sha256_file(train_jsonl)}]
        return sd.examples_manifest(examples, inputs=inputs)
    d = cfg.data
    inputs = sd.hotpot_inputs()
    if d.log_jsonl:
        inputs.append({"path": str(d.log_jsonl), "sha256": sha256_file(d.log_jsonl)})
    extra = {"teacher": d.teacher} if d.teacher else {}
    return sd.examples_manifest(examples, inputs=inputs, **extra)


def _eval_examples(cfg, eval_jsonl: str | None) -> list:
    from rl.adaptation import sft_data as sd

    if eval_jsonl:
        return sd.load_examples(eval_jsonl)[: cfg.eval.n or None]
    return sd.hotpot_split("valid", cfg.eval.n) if cfg.eval.n else []


def registry_file(value: str | None) -> Path | None:
    """--registry: `local` = the local registry of trained models (`<cache>/models/
    registry.yaml`, which `rag.models.default_registry()` reads), else a YAML path."""
    if not value:
        return None
    if value == "local":
        from rag.models import local_registry_path

        return local_registry_path()
    return Path(value)


def check_registry(value: str | None) -> None:
    """--registry, before any training: a directory, or a file that is not a registry YAML,
    is a ConfigError naming --registry (found after hours of training, it cost the run its
    registration)."""
    from rag.model_registry_writer import read_registry_file

    path = registry_file(value)
    if path is None:
        return
    output_file(path, "--registry", "registry YAML")
    try:
        read_registry_file(path)
    except ConfigError as exc:
        raise ConfigError("--registry", exc.message) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--registry", f"{path}: cannot read it ({exc})") from None


def _register(out: Path, name: str, merged: Path, registry: str | None = None) -> Path:
    """`<out>/models.yaml`, and the --registry file too when given (a new version of `name`
    there: `<name>@v<N>`, `<name>@best` by valid F1)."""
    from rl.adaptation.generator_export import write_registry_entry

    reg = write_registry_entry(out / "models.yaml", name, merged)
    print(f"registered generator {name!r} -> {merged}")
    print(f"  select it: RAGPILOT_MODELS={reg} ... --set generator={name}")
    extra = registry_file(registry)
    if extra is not None:
        write_registry_entry(extra, name, merged)
        print(f"  and in {extra} (select it: --set generator={name} or {name}@best)")
    return reg


SUBMIT_FLAGS = ("job_address", "cpus", "gpus", "working_dir", "wait")
RERANKER_FORWARD = ("config", "set", "run_dir", "stop_after", "no_register")
GENERATOR_FORWARD = ("config", "set", "out", "train_jsonl", "eval_jsonl", "model", "name",
                     "no_merge", "grpo_set", "registry", "pairs_jsonl")
"""The options a submitted job gets (flag = `--` + dest with dashes)."""


def forwarded_command(args: argparse.Namespace, head: list[str], spec) -> str:
    """The `ragpilot` command line of `args` (without the --submit flags): `head` then the
    option of each dest in `spec` the user gave; what a submitted job runs."""
    argv = ["ragpilot", *head]
    for dest in spec:
        flag, value = "--" + dest.replace("_", "-"), getattr(args, dest, None)
        if dest == "config" and value == str(default_config("rl/reranker.yaml")):
            continue  # the shipped default: the job's own install has it
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            for v in value:
                argv += [flag, str(v)]
        elif value not in (None, False):
            argv += [flag, str(value)]
    return shlex.join(argv)


def _submit(args: argparse.Namespace, head: list[str], spec) -> int | None:
    """With --submit: submit the command as a Ray job, print its id (and with --wait its
    logs); the exit code. Without: None (train here), after refusing the job-only flags."""
    if not args.submit:
        for dest in SUBMIT_FLAGS:
            if getattr(args, dest) not in (None, False):
                raise ConfigError("--" + dest.replace("_", "-"), "only with --submit")
        return None
    from rl.common.jobs import JobRequest, job_address, submit, wait

    job = JobRequest(forwarded_command(args, head, spec), job_address(args.job_address),
                     num_cpus=1.0 if args.cpus is None else args.cpus, num_gpus=args.gpus,
                     working_dir=args.working_dir or ".")
    job.check()
    job_id = submit(job)
    print(f"submitted Ray job {job_id} to {job.address}: {job.entrypoint}")
    print(f"  follow it: ray job logs --address {job.address} --follow {job_id}")
    if not args.wait:
        return 0
    status, logs = wait(job.address, job_id)
    print(logs, end="" if logs.endswith("\n") else "\n")
    print(f"job {job_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1


def add_submit_arguments(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("as a Ray job (rl.common.jobs)")
    g.add_argument("--submit", action="store_true",
                   help="submit this command to a Ray cluster's job server and print the job "
                        "id, instead of training here")
    g.add_argument("--job-address", help="the job server (dashboard) URL (default "
                                         "$RAY_ADDRESS when http(s)://, else "
                                         "http://127.0.0.1:8265)")
    g.add_argument("--cpus", type=float, help="CPUs the job's driver reserves (default 1)")
    g.add_argument("--gpus", type=float, help="GPUs the job's driver reserves (default none)")
    g.add_argument("--working-dir", help="directory uploaded with the job (default .)")
    g.add_argument("--wait", action="store_true",
                   help="follow the job to its end, print its logs; exit 1 unless it succeeded")


def cmd_train_reranker(args: argparse.Namespace) -> int:
    submitted = _submit(args, ["train-reranker"], RERANKER_FORWARD)
    if submitted is not None:
        return submitted
    from rl.adaptation.reranker_config import RerankerTrainConfig
    from rl.adaptation.reranker_trainer import run_training

    cfg = with_sets(RerankerTrainConfig.from_yaml(args.config) if args.config
                    else RerankerTrainConfig(), args.set)
    if args.stop_after is not None and args.stop_after < 1:
        raise ConfigError("--stop-after", "must be >= 1")
    summary = run_training(cfg, run_dir=args.run_dir, stop_after=args.stop_after,
                           register=not args.no_register,
                           log=lambda m: print(m, flush=True))
    print(json.dumps(summary, indent=1))
    return 0


def _train_grpo(args: argparse.Namespace, cfg, out: Path, name: str) -> int:
    """GRPO from --model (an SFT run's merged folder); --grpo-set KEY=VALUE overrides
    rl.adaptation.grpo.GRPOSettings fields. Registers the merged model like SFT does."""
    from dataclasses import fields

    from rl.adaptation.grpo import GRPOSettings, run_grpo, settings_from_env

    if not args.model:
        raise ConfigError("--model", "grpo starts from an SFT model: pass its merged folder")
    types = {f.name: type(getattr(GRPOSettings(), f.name)) for f in fields(GRPOSettings)}
    over: dict = {"seed": cfg.train.seed, "prompt_id": cfg.prompt_id}
    for kv in args.grpo_set or []:
        key, _, val = kv.partition("=")
        if key not in types:
            raise ConfigError(f"--grpo-set {key}", f"unknown GRPO setting (known: {sorted(types)})")
        over[key] = types[key](val)
    summary = run_grpo(args.model, out, settings_from_env(**over), merge=not args.no_merge)
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}, default=str))
    if not args.no_merge:
        _register(out, name, Path(summary["merged"]), args.registry)
    return 0


def _given_pairs(paths: list[str]) -> tuple[list[dict], dict]:
    """--pairs-jsonl files (rl.adaptation.prefs pair rows) concatenated, and their manifest
    (pair rows' ids/sources/ranker + each file's sha256)."""
    from rag.corpus.loaders import sha256_file
    from rl.adaptation.prefs import load_pairs, pairs_manifest

    pairs = [row for p in paths for row in load_pairs(p)]
    if not pairs:
        raise ConfigError("--pairs-jsonl", "no pair rows in the given files")
    manifest = pairs_manifest(pairs)
    manifest["inputs"] = [*manifest.get("inputs", []),
                          *({"path": str(p), "sha256": sha256_file(p)} for p in paths)]
    return pairs, manifest


def check_generator_flags(args: argparse.Namespace) -> None:
    """Flags that do nothing for the method asked for are refused (here and before a job is
    submitted), not silently dropped. The deprecated `--policy` becomes `--model` here, with a
    notice on stderr (both given: refused)."""
    legacy = getattr(args, "legacy_model", None)
    if legacy:
        if args.model:
            raise ConfigError("--policy", "give the model once: --model (--policy is its "
                                          "deprecated name)")
        print("deprecated: train-generator --policy is now --model (--policy will be removed "
              "in the next release)", file=sys.stderr)
        args.model, args.legacy_model = legacy, None
    if args.grpo_set and args.method != "grpo":
        raise ConfigError("--grpo-set", "only for grpo")
    if args.model and args.method == "sft":
        raise ConfigError("--model", "sft trains generator_sft.base_model (set it with --set "
                                     "base_model=...); --model is for dpo, ipo, orpo and grpo")
    if args.no_merge and args.registry:
        raise ConfigError("--registry", "--no-merge keeps only the adapter: nothing to register")


def cmd_train_generator(args: argparse.Namespace) -> int:
    check_generator_flags(args)
    submitted = _submit(args, ["train-generator", args.method], GENERATOR_FORWARD)
    if submitted is not None:
        return submitted
    cfg = _config(args)
    from rl.adaptation.generator_model import check_qlora

    check_qlora(cfg)  # fail before any data or model work
    if args.pairs_jsonl and args.method in ("sft", "grpo"):
        raise ConfigError("--pairs-jsonl", "only for dpo, ipo and orpo")
    check_registry(args.registry)
    out = Path(args.out)
    name = args.name or f"gen-{args.method}-{out.name}"
    if args.method == "grpo":
        return _train_grpo(args, cfg, out, name)
    out.mkdir(parents=True, exist_ok=True)
    train: list = []
    if not args.pairs_jsonl:  # given pairs need no SFT examples
        with progress.stage("train-generator: build the training examples"):
            train = build_train_examples(cfg, args.train_jsonl)
        if not train:
            raise ConfigError("generator_sft.data", "no training examples")
        from rl.adaptation.sft_data import save_examples

        save_examples(train, out / "train.jsonl")
    if args.method == "sft":
        from rl.adaptation.generator_export import merge_adapter
        from rl.adaptation.generator_trainer import SFTRun, alias_path

        run = SFTRun(cfg, out, train, _eval_examples(cfg, args.eval_jsonl),
                     data_manifest=train_manifest(cfg, args.train_jsonl, train))
        with progress.stage(f"train-generator sft: train on {len(train)} examples"):
            s = run.train()
        print(json.dumps({k: s[k] for k in ("steps_done", "tokens_per_s", "best_step",
                                            "best_eval_f1", "final_loss", "resumed_from")},
                         default=str))
        if args.no_merge:
            return 0
        ck = alias_path(out, "best") or alias_path(out, "latest")
        with progress.stage("train-generator: merge the adapter into the base model"):
            merged = merge_adapter(ck, out / "merged")
    else:
        from rl.adaptation.generator_export import merge_adapter
        from rl.adaptation.generator_model import load_base_model, load_tokenizer, resolve_base
        from rl.adaptation.prefs import (
            build_pairs,
            make_ranker,
            pairs_manifest,
            save_pairs,
            train_preferences,
        )

        start_model = Path(args.model) if args.model else resolve_base(cfg.base_model)
        if args.pairs_jsonl:  # ranked elsewhere (e.g. a judge on a GPU): train on them as is
            pairs, manifest = _given_pairs(args.pairs_jsonl)
        else:
            ranker_name, ranker = make_ranker(cfg.prefs.ranker, cfg.prefs.judge_model,
                                              cfg.device)
            tok = load_tokenizer(start_model)
            model = load_base_model(start_model, cfg)
            used = train[: cfg.prefs.n_pairs]
            with progress.stage(f"train-generator {args.method}: rank answers of "
                                f"{len(used)} examples into preference pairs"):
                pairs = build_pairs(model, tok, used, cfg, ranker)
            del model
            manifest = pairs_manifest(pairs, train_manifest(cfg, args.train_jsonl, used))
        save_pairs(pairs, out / "pairs.jsonl")
        print(f"{len(pairs)} preference pairs (ranker "
              f"{'+'.join(sorted({str(p.get('ranker')) for p in pairs}))})")
        with progress.stage(f"train-generator {args.method}: train on {len(pairs)} pairs"):
            m = train_preferences(args.method, start_model, pairs, cfg, out,
                                  data_manifest=manifest)
        print(json.dumps(m, default=str))
        if args.no_merge:
            return 0
        with progress.stage("train-generator: merge the adapter into the base model"):
            merged = merge_adapter(out / "adapter", out / "merged", base_path=start_model)
    _register(out, name, merged, args.registry)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("train-reranker", help="train a cross-encoder reranker (MiniLM init)")
    s.add_argument("--config", default=str(default_config("rl/reranker.yaml")),
                   help="YAML with a `reranker:` mapping (default: the shipped configs/rl/reranker.yaml)")
    add_set_argument(s, help="override a top-level key, e.g. --set max_items=100")
    s.add_argument("--run-dir", help="checkpoint directory (default: under the cache)")
    s.add_argument("--stop-after", type=int, help="stop after N steps (resume later)")
    s.add_argument("--no-register", action="store_true",
                   help="do not add the model to the local registry / MLflow")
    add_submit_arguments(s)
    s.set_defaults(func=cmd_train_reranker)

    s = sub.add_parser("train-generator",
                       help="LoRA SFT / DPO / IPO / ORPO / GRPO of the generator")
    s.add_argument("method", choices=["sft", "dpo", "ipo", "orpo", "grpo"])
    s.add_argument("--config", help=f"YAML with a `generator_sft:` mapping ({DEFAULT_CONFIG})")
    add_set_argument(s, help="dotted override, e.g. train.max_steps=20")
    s.add_argument("--out", required=True, help="run directory (re-run to resume)")
    s.add_argument("--train-jsonl", help="SFT examples (rl.adaptation.sft_data JSONL) instead of "
                                         "the configured datasets")
    s.add_argument("--eval-jsonl", help="evaluation examples (default: HotpotQA valid split)")
    s.add_argument("--model", help="dpo/ipo/orpo/grpo: the model to align (dpo/ipo/orpo "
                                   "default: base_model); normally an SFT run's merged folder")
    s.add_argument("--policy", dest="legacy_model", help=argparse.SUPPRESS)
    s.add_argument("--name", help="registry name of the trained generator")
    s.add_argument("--pairs-jsonl", action="append", metavar="FILE",
                   help="dpo/ipo/orpo: train on these preference pairs (rl.adaptation.prefs "
                        "rows, e.g. judge-ranked elsewhere) instead of ranking the model's own "
                        "samples; repeatable")
    s.add_argument("--no-merge", action="store_true", help="keep only the adapter")
    s.add_argument("--registry", help="also register the merged model in this registry YAML; "
                                      "`local` = <cache>/models/registry.yaml, which every "
                                      "config, the tuner and the bandit read by default")
    s.add_argument("--grpo-set", action="append", metavar="KEY=VALUE",
                   help="grpo: a rl.adaptation.grpo.GRPOSettings field, e.g. steps=80")
    add_submit_arguments(s)
    s.set_defaults(func=cmd_train_generator)
