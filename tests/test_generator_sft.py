"""Generator adaptation: SFT data, LoRA SFT with checkpoint/resume, DPO/IPO/ORPO, int8 inference,
export as a selectable generator. Model code runs on a tiny randomly initialised Llama built here;
one slow test runs LoRA steps on the real packaged SmolLM2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from rag.errors import ConfigError, DataError
from rag.generation.parse import parse_output
from rag.metrics.qa import best_em_f1
from rag.types import Context, Passage
from rl.adaptation.generator_config import GeneratorSFTConfig
from rl.adaptation.generator_export import merge_adapter, write_registry_entry
from rl.adaptation.generator_model import check_qlora, encode_example, load_base_model
from rl.adaptation.generator_trainer import SFTRun, alias_path
from rl.adaptation.sft_data import (
    SFTExample,
    format_target,
    hotpot_sft_examples,
    load_examples,
    log_sft_examples,
    save_examples,
    teacher_sft_examples,
    trim_sentences,
)

REPO = Path(__file__).resolve().parents[1]
FACTS = [("Ada Quill", "Stenmouth", "Where was Ada Quill born?"),
         ("Bram Hollis", "Corvale", "Where was Bram Hollis born?"),
         ("Cora Vane", "Millbrook", "Where was Cora Vane born?"),
         ("Dell Omar", "Ashford", "Where was Dell Omar born?"),
         ("Eli Stone", "Harrow", "Where was Eli Stone born?"),
         ("Fay Linde", "Oakridge", "Where was Fay Linde born?")]


def _toy_examples() -> list[SFTExample]:
    out = []
    for k, (who, town, q) in enumerate(FACTS):
        other = FACTS[(k + 1) % len(FACTS)]
        ctx = (Context(f"o{k}", other[0], f"{other[0]} was born in {other[1]} ."),
               Context(f"g{k}", who, f"{who} was born in {town} ."))
        out.append(SFTExample(f"q{k}", q, ctx, format_target(town, [2]), answers=(town,),
                              gold_positions=(2,)))
    return out


def _build_tiny(path: Path) -> Path:
    """A 2-layer Llama with a word-level tokenizer over the toy vocabulary (no chat template:
    the plain-text prompt path)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from rag.generation.prompts import get_prompt

    words: set[str] = set()
    tpl = get_prompt("cite_concise")
    for e in _toy_examples():
        words.update(tpl.text(e.question, e.contexts).split() + e.target.split())
    words.update(["[1]", "[2]", "[3]", "Answer:", "yes", "no"])
    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {w: i for i, w in enumerate(specials + sorted(words))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                  bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=2,
                      eos_token_id=3, tie_word_embeddings=True,
                      initializer_range=0.3)  # large enough that LoRA can move the logits
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def _cfg(tiny: Path, **kw) -> GeneratorSFTConfig:
    base = {"base_model": str(tiny), "max_len": 128, "threads": 1,
            "lora": {"r": 4, "alpha": 8, "dropout": 0.1},
            "train": {"lr": 5e-3, "batch_size": 2, "max_steps": 6, "warmup_steps": 1, "seed": 3},
            "checkpoint": {"every_steps": 2, "keep": 1},
            "eval": {"every_steps": 3, "n": 3, "max_new_tokens": 4},
            "mlflow": {"enabled": False}}
    for k, v in kw.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and k in base else v
    return GeneratorSFTConfig.from_dict(base)


# --------------------------------------------------------------------------- config


def test_config_file_loads_and_names_bad_keys(tmp_path):
    cfg = GeneratorSFTConfig.from_yaml(REPO / "configs" / "rl" / "generator_sft.yaml")
    assert (cfg.lora.r, cfg.max_len, cfg.qlora) == (8, 384, False)
    assert cfg.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")
    bad = tmp_path / "bad.yaml"
    bad.write_text("generator_sft:\n  lora: {r: 8, rank: 4}\n")
    with pytest.raises(ConfigError, match=r"generator_sft\.lora\.rank"):
        GeneratorSFTConfig.from_yaml(bad)
    with pytest.raises(ConfigError, match=r"generator_sft\.train\.lr"):
        GeneratorSFTConfig.from_dict({"train": {"lr": -1}})
    with pytest.raises(ConfigError, match="prompt_id"):
        GeneratorSFTConfig.from_dict({"prompt_id": "nope"})
    with pytest.raises(ConfigError, match=r"generator_sft\.train\.nope"):
        cfg.replace(**{"train.nope": 1})
    assert cfg.replace(**{"train.lr": 1e-4}).train.lr == 1e-4
    # the QLoRA switch: same file, alias load_in_4bit; refused without a GPU, key named
    q = GeneratorSFTConfig.from_dict({"load_in_4bit": True})
    assert q.qlora is True
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"generator_sft\.qlora"):
            check_qlora(q)
        with pytest.raises(ConfigError, match=r"generator_sft\.qlora"):
            load_base_model("/nonexistent", q)


# --------------------------------------------------------------------------- data


def test_trim_keeps_supporting_sentences():
    sents = ["A" * 50, "B" * 50, "C" * 50, "D" * 50, "E" * 50]
    out = trim_sentences(sents, [3], max_chars=110)
    assert "D" * 50 in out and "A" * 50 not in out and len(out) <= 110
    assert out.index("C") < out.index("D")  # original order kept
    assert trim_sentences(sents, [], 60) == "A" * 50
    assert trim_sentences(sents, [1, 2], 60) == "B" * 50 + " " + "C" * 50  # supports never cut


def test_hotpot_sft_examples_train_split_only():
    from conftest import require_dataset
    from rag.corpus.hygiene import load_split

    path = require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl")
    split = load_split("hotpotqa")
    train = split.ids("train")[:20]
    exs = hotpot_sft_examples(path, train, n_distractors=1, max_context_chars=300, seed=1,
                              split_ids=split.splits)
    assert [e.id for e in exs] == train
    ems = []
    for e in exs:
        assert len(e.contexts) == 3 and len(e.gold_positions) == 2
        text, cites = parse_output(e.target, len(e.contexts), True, e.question)
        ems.append(best_em_f1(text, e.answers)[0])  # the served parser reads the target back
        assert set(cites) == set(e.gold_positions)
    assert sum(ems) >= 0.8 * len(ems)
    # trimmed to 300 chars unless the supporting sentences alone are longer (never cut)
    lens = [len(c.text) for e in exs for c in e.contexts]
    assert sum(n <= 300 for n in lens) >= 0.8 * len(lens)
    full = hotpot_sft_examples(path, train[:5], n_distractors=0, trim=False)
    assert all(len(e.contexts) == 2 for e in full)
    assert sum(len(c.text) for e in full for c in e.contexts) > sum(
        len(c.text) for e in exs[:5] for c in e.contexts if c.title in {x.title for x in
                                                                        full[exs.index(e)].contexts})
    with pytest.raises(ConfigError, match="train_ids"):
        hotpot_sft_examples(path, [split.ids("test")[0]], split_ids=split.splits)


def test_log_examples_from_the_real_store_export(tmp_path):
    from serving.store import Interaction, open_store

    store = open_store(tmp_path / "log.sqlite")
    rows = [("a", "Where was Ada born?", "Stenmouth", ["p1", "p2"], [2], 0.9, False),
            ("b", "Where was Bo born?", "Corvale", ["p1"], [1], 0.2, False),   # low reward
            ("c", "Where was Cy born?", "Harrow", ["p2"], [1], None, False),   # unrated
            ("d", "Where was Di born?", "Ashford", ["p9"], [1], 1.0, False),   # unknown ctx
            ("e", "Where was Ed born?", "Oakridge", ["p2"], [1], 1.0, True)]   # shadow
    for iid, q, a, ctx, cites, _, shadow in rows:
        store.log_interaction(Interaction(iid, q, "v1", "bandit", 0.5, a, context_ids=ctx,
                                          citations=cites, shadow=shadow,
                                          parent_id="a" if shadow else None))
    for iid, *_, reward, shadow in rows:
        if reward is not None and not shadow:
            store.add_feedback(iid, reward)
    out = tmp_path / "log.jsonl"
    store.export_jsonl(out)
    store.close()
    passages = {"p1": Passage("p1", "Ada Quill lives in Corvale.", "Ada"),
                "p2": Passage("p2", "Ada Quill was born in Stenmouth.", "Stenmouth")}
    exs = log_sft_examples(out, passages, min_reward=0.7)
    assert [e.id for e in exs] == ["a"]
    assert exs[0].target == "Stenmouth [2]" and exs[0].source == "log"
    assert [c.id for c in exs[0].contexts] == ["p1", "p2"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "question": "q"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field .answer"):
        log_sft_examples(bad, passages)
    with pytest.raises(ConfigError, match="min_reward"):
        log_sft_examples(out, passages, min_reward=2)
    save_examples(exs, tmp_path / "sft.jsonl")
    assert load_examples(tmp_path / "sft.jsonl") == exs


class _Teacher(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        q = body["messages"][1]["content"]
        content = ("Stenmouth [2]" if "Ada Quill" in q else "Harrow" if "Bram" in q
                   else "Wrongtown [1]")
        out = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_teacher_distillation_through_an_openai_compatible_stub(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path))
    from rag.generation.openai_compat import OpenAIChatGenerator

    srv = HTTPServer(("127.0.0.1", 0), _Teacher)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        teacher = OpenAIChatGenerator(f"http://127.0.0.1:{srv.server_port}/v1", "t",
                                      cache=False)
        out = teacher_sft_examples(_toy_examples()[:3], teacher, min_f1=0.5)
    finally:
        srv.shutdown()
    # q0: right + cited -> kept; q1: no citation -> dropped; q2: wrong answer -> dropped
    assert [(e.id, e.target, e.source) for e in out] == [("q0", "Stenmouth [2]", "teacher")]


def test_encode_masks_prompt_and_fits_max_len(tiny):
    from rl.adaptation.generator_model import load_tokenizer

    tok = load_tokenizer(tiny)
    ex = _toy_examples()[0]
    ids, labels = encode_example(tok, ex, "cite_concise", 128)
    n_t = sum(t != -100 for t in labels)
    assert len(ids) == len(labels) and n_t == 3  # "Stenmouth [2] </s>"
    assert tok.decode([t for t in labels if t != -100]) .split()[:2] == ["Stenmouth", "[2]"]
    long = SFTExample("L", ex.question, tuple(Context(c.id, c.title, c.text * 30)
                                              for c in ex.contexts), ex.target, answers=("x",))
    ids2, _ = encode_example(tok, long, "cite_concise", 128)
    assert len(ids2) <= 128
    assert encode_example(tok, long, "cite_concise", 20) is None


# --------------------------------------------------------------------------- training/resume


def _adapter(out: Path, alias: str = "latest") -> dict:
    from safetensors.torch import load_file

    return load_file(str(alias_path(out, alias) / "adapter_model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


_CHILD = """
import sys, time
sys.path[:0] = {paths!r}
from tests.test_generator_sft import _cfg, _toy_examples
from rl.adaptation.generator_trainer import SFTRun
from pathlib import Path
import rl.adaptation.generator_trainer as s
orig = s.SFTRun._save
def slow_save(self, *a, **k):
    r = orig(self, *a, **k)
    print("SAVED", r.name, flush=True)
    time.sleep(0.5)
    return r
s.SFTRun._save = slow_save
ex = _toy_examples()
SFTRun(_cfg(Path({tiny!r})), {out!r}, ex, ex[:3], log=lambda m: None).train()
"""


def test_killed_run_resumes_to_the_uninterrupted_result(tiny, tmp_path):
    ex = _toy_examples()
    full = SFTRun(_cfg(tiny), tmp_path / "full", ex, ex[:3], log=lambda m: None).train()
    assert full["finished"] and full["steps_done"] == 6 and full["tokens_per_s"] > 0
    assert alias_path(tmp_path / "full", "latest").name == "step-000006"
    best = alias_path(tmp_path / "full", "best")
    meta = json.loads((best / "meta.json").read_text())
    assert meta["step"] in (3, 6) and meta["lora_r"] == 4 and meta["max_len"] == 128
    assert meta["base_model"] == str(tiny) and "eval_f1" in meta["eval"]

    # a real kill: SIGKILL the training process right after its first checkpoint
    out = tmp_path / "killed"
    code = _CHILD.format(paths=[str(REPO / "src"), str(REPO)], tiny=str(tiny), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = ""
    deadline = time.time() + 120
    while time.time() < deadline and "SAVED" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "SAVED" in line, "child never checkpointed"
    killed_at = json.loads((alias_path(out, "latest") / "meta.json").read_text())["step"]
    assert killed_at < 6
    resumed = SFTRun(_cfg(tiny), out, ex, ex[:3], log=lambda m: None).train()
    assert resumed["resumed_from"] == killed_at and resumed["finished"]
    assert _max_diff(_adapter(tmp_path / "full"), _adapter(out)) < 1e-5
    assert abs(resumed["final_loss"] - full["final_loss"]) < 1e-5

    # in-process stop after step 5 (last checkpoint: step 4, so step 5 is redone), then to the
    # end: same adapter again
    out2 = tmp_path / "stepwise"
    r1 = SFTRun(_cfg(tiny), out2, ex, ex[:3], log=lambda m: None).train(stop_after=5)
    assert not r1["finished"] and r1["steps_done"] == 5
    assert alias_path(out2, "latest").name == "step-000004"
    r2 = SFTRun(_cfg(tiny), out2, ex, ex[:3], log=lambda m: None).train()
    assert r2["resumed_from"] == 4
    assert _max_diff(_adapter(tmp_path / "full"), _adapter(out2)) < 1e-5
    # checkpoints beyond `keep` are pruned, aliases kept
    kept = sorted(p.name for p in (out2 / "checkpoints").glob("step-*"))
    assert "step-000006" in kept and len(kept) <= 2


def test_training_lowers_loss_and_learns_the_format(tiny, tmp_path):
    ex = _toy_examples()
    cfg = _cfg(tiny, train={"max_steps": 30, "lr": 3e-2}, eval={"every_steps": 30, "n": 6},
               lora={"dropout": 0.0}, checkpoint={"every_steps": 30})
    run = SFTRun(cfg, tmp_path / "fit", ex, ex, log=lambda m: None)
    s = run.train()
    hist = json.loads((tmp_path / "fit" / "summary.json").read_text())
    assert hist["final_loss"] < 0.5 * _first_loss(run)
    assert s["best_eval_f1"] >= 0.8  # memorised towns + citations on the training questions


def test_first_step_loss_is_the_full_logits_loss(tiny, tmp_path):
    """The trainer computes the LM head only where targets are predicted; its first logged
    loss equals the answer-token cross-entropy over the full logits of the same batch."""
    import torch

    from rl.adaptation.generator_model import load_tokenizer

    ex = _toy_examples()
    cfg = _cfg(tiny, train={"max_steps": 1}, lora={"dropout": 0.0}, eval={"n": 0},
               checkpoint={"every_steps": 1})
    run = SFTRun(cfg, tmp_path / "one", ex, log=lambda m: None)
    batch = run.batch_indices(0)
    from transformers import AutoModelForCausalLM

    model, tok = AutoModelForCausalLM.from_pretrained(str(tiny)), load_tokenizer(tiny)
    total = n = 0.0
    with torch.no_grad():
        for i in batch:
            ids, lab = encode_example(tok, ex[i], cfg.prompt_id, cfg.max_len)
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            total += float(torch.nn.functional.cross_entropy(
                logits, torch.tensor(lab[1:]), ignore_index=-100, reduction="sum"))
            n += sum(t != -100 for t in lab)
    run.train()  # LoRA B starts at zero: step 1's loss is the base model's
    assert abs(_first_loss(run) - total / n) < 1e-5


def _first_loss(run: SFTRun) -> float:
    import torch

    ck = torch.load(alias_path(run.out, "latest") / "trainer_state.pt", weights_only=False)
    return ck["state"]["history"][0]["loss"]


def test_mlflow_aliases_and_metadata(tiny, tmp_path):
    import mlflow

    ex = _toy_examples()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(tiny, mlflow={"enabled": True, "experiment": "gen_test"},
               train={"max_steps": 4})
    s = SFTRun(cfg, tmp_path / "run", ex, ex[:2], mlflow_uri=uri, log=lambda m: None).train()
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    run = client.get_run(s["mlflow_run_id"])
    assert run.data.tags["alias.latest"] == "step-000004"
    assert run.data.params["lora_r"] == "4" and run.data.params["max_len"] == "128"
    assert "eval_f1" in run.data.metrics and "tokens_per_s" in run.data.metrics
    mv = client.get_model_version_by_alias("gen_test-run", "newest")
    assert mv.tags["step"] == "4" and mv.tags["lora_r"] == "4"
    versions = client.search_model_versions("name = 'gen_test-run'")
    assert int(mv.version) == max(int(v.version) for v in versions)
    best = client.get_model_version_by_alias("gen_test-run", "best")
    assert "eval_f1" in best.tags
    arts = {a.path for a in client.list_artifacts(s["mlflow_run_id"], "checkpoints")}
    assert "checkpoints/step-000004" in arts
    # provenance (issue 9): the commit and the manifest of the examples actually trained on
    from rag.provenance import code_commit, manifest_sha256
    from rl.adaptation.sft_data import examples_manifest

    man = examples_manifest(ex)
    assert man["dataset"] == "hotpotqa" and man["examples"] == len(ex)
    assert man["inputs"] == []  # toy ids are not HotpotQA train ids: no input files claimed
    assert run.data.tags["code_commit"] == code_commit()
    assert run.data.tags["dataset"] == "hotpotqa"
    assert run.data.tags["dataset_manifest_sha256"] == manifest_sha256(man)
    assert json.loads((tmp_path / "run" / "dataset_manifest.json").read_text()) == man
    (tmp_path / "dl").mkdir()
    logged = client.download_artifacts(s["mlflow_run_id"], "dataset_manifest.json",
                                       str(tmp_path / "dl"))
    assert json.loads(Path(logged).read_text()) == man
    # another subset of examples -> another manifest id
    assert manifest_sha256(examples_manifest(ex[:3])) != manifest_sha256(man)


def test_examples_manifest_of_the_hotpotqa_train_split():
    from conftest import require_dataset
    from rl.adaptation.sft_data import examples_manifest, hotpot_split

    require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl")

    ex = hotpot_split("train", 3)
    man = examples_manifest(ex)
    assert (man["dataset"], man["split"], man["examples"]) == ("hotpotqa", "train", 3)
    paths = {i["path"]: i["sha256"] for i in man["inputs"]}
    assert set(paths) == {"configs/splits/hotpotqa.json",
                          "hotpotqa/hotpot_dev_distractor_1100.jsonl"}
    split = json.loads((REPO / "configs/splits/hotpotqa.json").read_text())
    assert paths["hotpotqa/hotpot_dev_distractor_1100.jsonl"] == \
        split["source_sha256"]["hotpot_dev_distractor_1100.jsonl"]
    from rag.provenance import provenance_tags

    tags = provenance_tags(man)
    assert tags["dataset_sha256/configs/splits/hotpotqa.json"] == \
        paths["configs/splits/hotpotqa.json"]


def test_merged_model_is_a_selectable_generator(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    ex = _toy_examples()
    cfg = _cfg(tiny, train={"max_steps": 2})
    SFTRun(cfg, tmp_path / "run", ex, log=lambda m: None).train()
    merged = merge_adapter(alias_path(tmp_path / "run", "latest"), tmp_path / "merged")
    reg_file = write_registry_entry(tmp_path / "models.yaml", "tiny-sft", merged)
    from rag.generation.factory import make_generator
    from rag.models import ModelRegistry

    reg = ModelRegistry.from_yaml(reg_file)
    assert reg.get("tiny-sft").format == "hf"
    gen = make_generator("tiny-sft", registry=reg, cache=False)
    g = gen.generate(ex[0].question, ex[0].contexts, "cite_concise", max_new_tokens=3)
    assert g.tokens_in > 10 and 0 < g.tokens_out <= 3
    # merged weights differ from the base (LoRA was applied) but keep its shapes
    from safetensors.torch import load_file

    a = load_file(str(tiny / "model.safetensors"))
    b = load_file(str(merged / "model.safetensors"))
    q = next(k for k in a if "q_proj" in k)
    assert a[q].shape == b[q].shape and float((a[q] - b[q]).abs().max()) > 0


# --------------------------------------------------------------------------- preferences


@pytest.mark.parametrize("method", ["dpo", "ipo", "orpo"])
def test_preference_training_runs(tiny, tmp_path, method):
    from rl.adaptation.generator_model import load_tokenizer
    from rl.adaptation.prefs import build_pairs, f1_ranker, train_preferences

    ex = _toy_examples()
    cfg = _cfg(tiny, prefs={"steps": 2, "batch_size": 2})
    tok = load_tokenizer(tiny)
    model = load_base_model(tiny, cfg)
    pairs = build_pairs(model, tok, ex, cfg, f1_ranker, n_samples=1)
    assert pairs and all(p["rejected_score"] < p["chosen_score"] for p in pairs)
    # a pair whose prompt alone fills max_len: left out and counted (ORPO turned it into NaN)
    too_long = {**pairs[0], "prompt": pairs[0]["prompt"] + " filler" * 200}
    m = train_preferences(method, tiny, [too_long, *pairs], cfg, tmp_path / method)
    assert m["steps"] == 2 and m["n_pairs"] == len(pairs) and m["n_pairs_too_long"] == 1
    assert m["n_pairs_given"] == len(pairs) + 1
    assert m["last_loss"] is not None and m["last_loss"] == m["last_loss"]  # finite, not NaN
    assert (tmp_path / method / "adapter" / "adapter_model.safetensors").exists()
    with pytest.raises(ConfigError, match="method"):
        train_preferences("ppo", tiny, pairs, cfg, tmp_path / "x")


def test_preference_run_logs_provenance_and_ranker(tiny, tmp_path):
    import mlflow

    from rag.provenance import code_commit, manifest_sha256
    from rl.adaptation.generator_model import load_tokenizer
    from rl.adaptation.prefs import build_pairs, make_ranker, pairs_manifest, train_preferences
    from rl.adaptation.sft_data import examples_manifest

    ex = _toy_examples()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg(tiny, prefs={"steps": 1, "batch_size": 2},
               mlflow={"enabled": True, "experiment": "gen_pref_test"})
    name, ranker = make_ranker("f1")
    pairs = build_pairs(load_base_model(tiny, cfg), load_tokenizer(tiny), ex, cfg, ranker,
                        n_samples=1)
    assert pairs and {p["ranker"] for p in pairs} == {"f1"}
    man = pairs_manifest(pairs, examples_manifest(ex))
    assert man["pairs"] == len(pairs) and man["ranker"] == "f1" and man["examples"] == len(ex)
    m = train_preferences("dpo", tiny, pairs, cfg, tmp_path / "dpo", data_manifest=man,
                          mlflow_uri=uri)
    assert m["ranker"] == "f1"
    mlflow.set_tracking_uri(uri)
    run = mlflow.MlflowClient().get_run(m["mlflow_run_id"])
    assert run.data.tags["code_commit"] == code_commit()
    assert run.data.tags["dataset"] == "hotpotqa" and run.data.tags["ranker"] == "f1"
    assert run.data.tags["dataset_manifest_sha256"] == manifest_sha256(man)
    assert run.data.params["method"] == "dpo" and "train_loss" in run.data.metrics
    saved = json.loads((tmp_path / "dpo" / "dataset_manifest.json").read_text())
    assert saved == json.loads(json.dumps(man))
    # without an explicit manifest one is derived from the pair rows
    derived = pairs_manifest(pairs)
    assert derived["dataset"] == "hotpotqa" and derived["pairs_sha256"] == man["pairs_sha256"]


def test_auto_ranker_loads_the_installed_reward_model(tmp_path, monkeypatch):
    """`ranker: auto` = the committed quality-rm (found without RAGPILOT_REWARD_MODELS), named
    in the result; f1 only when no reward model is installed anywhere."""
    import rag.metrics.reward_model as rmod
    from rl.adaptation.prefs import f1_ranker, make_ranker

    monkeypatch.delenv("RAGPILOT_REWARD_MODELS", raising=False)
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    ex = _toy_examples()[0]
    name, rank = make_ranker("auto")
    rm = rmod.load_default()  # the newest committed version
    assert rm.path.parent == rmod.BUNDLED_ROOT / "quality-rm"
    assert name == f"reward_model:quality-rm/{rm.path.name}" and rank.ranker_name == name
    town = ex.answers[0]
    # scored by the reward model against the cited context (all contexts without citations)
    assert rank(ex, town, [2]) == pytest.approx(rm.score(ex.question, [ex.contexts[1]], town))
    assert rank(ex, town, []) == pytest.approx(rm.score(ex.question, list(ex.contexts), town))
    assert rank(ex, town, [2]) > rank(ex, "Napoleon Bonaparte in 1925", [2])
    # nothing installed: f1
    monkeypatch.setattr(rmod, "BUNDLED_ROOT", tmp_path / "none")
    name, rank = make_ranker("auto")
    assert name == "f1" and rank(ex, town, [2]) == f1_ranker(ex, town, [2])
    with pytest.raises(ConfigError, match="prefs.ranker"):
        make_ranker("bleu")


# --------------------------------------------------------------------------- CLI


def test_cli_train_generator(tiny, tmp_path, capsys):
    from serving.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("generator_sft:\n  train: {lr: 0.1, epochz: 2}\n")
    assert main(["train-generator", "sft", "--config", str(bad), "--out",
                 str(tmp_path / "o")]) == 2
    assert "generator_sft.train.epochz" in capsys.readouterr().err
    assert main(["train-generator", "sft", "--out", str(tmp_path / "o"), "--set",
                 "qlora=true"]) == 2
    assert "generator_sft.qlora" in capsys.readouterr().err
    ex = _toy_examples()
    data = tmp_path / "train.jsonl"
    save_examples(ex, data)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(json.dumps({"generator_sft": _cfg(tiny).model_dump(mode="json")}))
    rc = main(["train-generator", "sft", "--config", str(cfg), "--out", str(tmp_path / "run"),
               "--train-jsonl", str(data), "--eval-jsonl", str(data), "--name", "tiny-cli",
               "--set", "train.max_steps=2", "--registry", str(tmp_path / "local.yaml")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "tiny-cli" in out
    reg = (tmp_path / "run" / "models.yaml").read_text()
    assert "tiny-cli" in reg and "format: hf" in reg
    # --registry: the same version also lands in the shared registry file (@v1, @best)
    local = yaml.safe_load((tmp_path / "local.yaml").read_text())["models"]
    assert {"tiny-cli", "tiny-cli@v1", "tiny-cli@best"} <= set(local)
    assert local["tiny-cli@best"]["path"] == str((tmp_path / "run" / "merged").resolve())
    rc = main(["train-generator", "dpo", "--config", str(cfg), "--out", str(tmp_path / "dpo"),
               "--train-jsonl", str(data), "--model", str(tmp_path / "run" / "merged"),
               "--set", "prefs.steps=1", "--name", "tiny-dpo"])
    assert rc == 0 and (tmp_path / "dpo" / "merged" / "config.json").exists()
    # pairs ranked elsewhere (a judge on another machine): trained on as given
    given = tmp_path / "judged.jsonl"
    rows = [json.loads(x) for x in (tmp_path / "dpo" / "pairs.jsonl").read_text().splitlines()]
    given.write_text("".join(json.dumps({**r, "ranker": "judge:test"}) + "\n" for r in rows))
    rc = main(["train-generator", "dpo", "--config", str(cfg), "--out", str(tmp_path / "jd"),
               "--pairs-jsonl", str(given), "--model", str(tmp_path / "run" / "merged"),
               "--set", "prefs.steps=1", "--name", "tiny-jdpo"])
    assert rc == 0 and (tmp_path / "jd" / "merged" / "config.json").exists()
    summary = json.loads((tmp_path / "jd" / "summary.json").read_text())
    assert summary["ranker"] == "judge:test" and summary["n_pairs"] == len(rows)
    manifest = json.loads((tmp_path / "jd" / "dataset_manifest.json").read_text())
    assert str(given) in [i["path"] for i in manifest["inputs"]]
    bad = tmp_path / "bad_pairs.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "a"}) + "\n")
    assert main(["train-generator", "dpo", "--out", str(tmp_path / "x"), "--pairs-jsonl",
                 str(bad)]) == 2
    assert "bad_pairs.jsonl" in capsys.readouterr().err
    assert main(["train-generator", "sft", "--out", str(tmp_path / "x"), "--pairs-jsonl",
                 str(given)]) == 2
    assert "--pairs-jsonl" in capsys.readouterr().err


# --------------------------------------------------------------------------- real weights


@pytest.mark.slow
def test_real_smollm2_lora_steps(tmp_path):
    from conftest import require_dataset
    from rag.corpus.hygiene import load_split

    path = require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl")
    split = load_split("hotpotqa")
    exs = hotpot_sft_examples(path, split.ids("train")[:2], n_distractors=0,
                              max_context_chars=200, split_ids=split.splits)
    cfg = GeneratorSFTConfig.from_dict({
        "max_len": 256, "train": {"max_steps": 2, "batch_size": 1, "warmup_steps": 0},
        "checkpoint": {"every_steps": 1, "keep": 1}, "eval": {"every_steps": 2, "n": 1,
                                                              "max_new_tokens": 8},
        "mlflow": {"enabled": False}})
    s = SFTRun(cfg, tmp_path / "real", exs, exs[:1], log=lambda m: None).train()
    assert s["finished"] and s["lora_r"] == 8 and s["tokens"] > 100
    assert s["final_loss"] > 0 and s["tokens_per_s"] > 1
    ad = _adapter(tmp_path / "real")
    assert len([k for k in ad if "lora_A" in k]) == 30 * 4  # 30 layers x q/k/v/o
