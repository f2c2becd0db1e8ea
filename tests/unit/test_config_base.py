"""The one strict settings base (rag.settings_base), the defaults shipped as package data
(rag.resources), the one PPO settings model, and `import rag` leaving the process alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.resources import bundled, configs_root, default_config
from rl.common.ppo_settings import SELECTION_PPO, TUNER_PPO
from rl.kernel.settings import TunerSettings
from rl.selection.config import SelectionConfig

REPO = Path(__file__).resolve().parents[2]


def test_unknown_key_named_with_file_and_line_even_beside_a_missing_required_key(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("policy:\n  seed: 1\n  bounds:\n    k:\n      min: 3\n      maxx: 10\n")
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_yaml(p)
    err = e.value
    assert err.field == "policy.bounds.k.maxx" and err.message.startswith("unknown key")
    assert "`max`" in err.message  # the key probably meant
    assert err.source == str(p) and err.line == 6
    assert str(err).startswith("policy.bounds.k.maxx: unknown key") and f"{p}:6" in str(err)


def test_bare_file_and_bad_value_lines(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("seed: 0\nbounds:\n  k: {min: 9, max: 3}\n")
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_yaml(p)
    assert e.value.field == "policy.bounds.k" and e.value.line == 3
    p.write_text("episode:\n  length: 0\n")
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_yaml(p)
    assert e.value.field == "policy.episode.length" and e.value.line == 2


def test_missing_key_points_at_its_parent_line(tmp_path):
    p = tmp_path / "rollout.yaml"
    p.write_text("rollout:\n  alpha: 0.05\n  stages:\n    shadow: {min_n: 3}\n")
    from rl.promotion.settings import PromotionSettings

    with pytest.raises(ConfigError) as e:
        PromotionSettings.from_yaml(p)
    assert e.value.field == "rollout.stages.shadow.max_n" and e.value.line == 4


def test_nested_rag_config_of_a_policy_is_located(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("policy:\n  base:\n    generator: extractive\n    kk: 3\n")
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_yaml(p)
    assert e.value.field == "policy.base.kk" and e.value.line == 4


def test_mapping_errors_carry_no_location():
    with pytest.raises(ConfigError) as e:
        RAGConfig.from_dict({"topk": 3})
    assert e.value.field == "rag.topk" and e.value.source is None and e.value.line is None
    assert str(e.value).startswith("rag.topk: unknown key")


def test_defaults_readable_through_importlib_resources():
    import importlib.resources

    root = configs_root()
    for rel in ("rag/default.yaml", "rag/models.yaml", "rag/indexes.yaml",
                "rl/tuner.yaml", "rl/selection.yaml", "rl/rollout.yaml",
                "rl/reranker.yaml", "rl/generator_sft.yaml", "serve/default.yaml",
                "splits/hotpotqa.json"):
        assert default_config(rel).is_file(), rel
    # in a source checkout the shipped files are the checkout's configs/ (one copy of each)
    assert (root / "rl" / "tuner.yaml").read_text() == \
        (REPO / "configs" / "rl" / "tuner.yaml").read_text()
    json.loads(default_config("splits/scifact.json").read_text())
    assert TunerSettings.defaults() == TunerSettings.from_yaml(
        REPO / "configs" / "rl" / "tuner.yaml")
    rm = bundled("reward_models") / "quality-rm"
    assert rm == Path(str(importlib.resources.files("rag"))) / "bundled/reward_models/quality-rm"
    assert (rm / "v1" / "manifest.json").is_file()


def test_pyproject_ships_the_defaults_and_the_bundled_models():
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"]["ragpilot_configs"] == "configs"
    data = cfg["package-data"]
    assert {"*/*.yaml", "*/*.json"} <= set(data["ragpilot_configs"])
    shipped = {p.relative_to(REPO / "src/rag").as_posix()
               for p in (REPO / "src/rag/bundled").rglob("*") if p.is_file()}
    import fnmatch

    assert shipped and all(any(fnmatch.fnmatch(f, pat) for pat in data["rag"]) for f in shipped)
    nested = {p.relative_to(REPO / "configs").as_posix()
              for p in (REPO / "configs").rglob("*") if p.suffix in (".yaml", ".json")}
    assert all(any(fnmatch.fnmatch(f, pat) for pat in data["ragpilot_configs"]) for f in nested)


def test_no_module_finds_defaults_relative_to_its_own_file():
    hits = [str(p) for p in (REPO / "src").rglob("*.py") if "parents[" in p.read_text()]
    assert hits == []


def test_import_rag_leaves_the_environment_unchanged():
    code = ("import json, os; before = dict(os.environ); "
            "import rag, rag.config, rag.pipeline, serving, rl; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "HF_HUB_OFFLINE",
                        "TRANSFORMERS_OFFLINE", "RAY_DEDUP_LOGS", "TOKENIZERS_PARALLELISM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_one_ppo_model_two_readers(tmp_path):
    t, s = TunerSettings(), SelectionConfig()
    assert type(t.ppo) is type(s.ppo)
    assert t.ppo == TUNER_PPO.settings and s.ppo == SELECTION_PPO.settings
    # a partial section keeps the reader's own defaults for the rest
    assert TunerSettings.from_dict({"ppo": {"lr": 0.02}}).ppo.num_epochs == 16
    assert SelectionConfig.from_dict({"ppo": {"lr": 0.02}}).ppo.num_epochs == 4
    # selection.yaml's RLlib-style `lambda_` stays valid
    p = tmp_path / "s.yaml"
    p.write_text("selection:\n  ppo:\n    lambda_: 0.5\n")
    assert SelectionConfig.load(p).ppo.gae_lambda == 0.5
    # keys a reader does not use are unknown keys for it
    with pytest.raises(ConfigError) as e:
        TunerSettings.from_dict({"ppo": {"iterations": 3}})
    assert e.value.field == "policy.ppo.iterations" and "unknown key" in e.value.message
    with pytest.raises(ConfigError) as e:
        SelectionConfig.from_dict({"ppo": {"hidden": [8]}})
    assert e.value.field == "selection.ppo.hidden"
    # dumps load back
    assert TunerSettings.from_dict(t.model_dump(mode="json", by_alias=True)) == t
    assert SelectionConfig.from_dict(s.model_dump(mode="json")) == s


def test_provenance_tags_of_absolute_and_relative_paths_are_valid_mlflow_names():
    """A dataset given by absolute path used to give `dataset_sha256//tmp/...`, which MLflow
    refuses (the README's own-data path crashed at `tune`)."""
    from mlflow.utils.validation import _validate_tag_name

    from rag.provenance import provenance_tags

    tags = provenance_tags({"dataset": "mine", "inputs": [
        {"path": "/tmp/my data/corpus.jsonl", "sha256": "a"},
        {"path": "hotpotqa/../dev.jsonl", "sha256": "b"}]})
    keys = [k for k in tags if k.startswith("dataset_sha256/")]
    assert keys == ["dataset_sha256/tmp/my data/corpus.jsonl", "dataset_sha256/hotpotqa/dev.jsonl"]
    for k in keys:
        _validate_tag_name(k)


def test_config_files_and_values_a_person_gets_wrong_are_named(tmp_path, capsys):
    """Found by the CLI audit (stop 56): each of these was accepted or was a traceback."""
    from serving.cli import main

    f = tmp_path / "c.yaml"
    # `k: true` was read as k = 1 (pydantic's lax bool -> int); the same through --set
    f.write_text("rag:\n  variant: bm25\n  k: true\n")
    with pytest.raises(ConfigError) as e:
        RAGConfig.from_yaml(f)
    assert (e.value.field, e.value.line) == ("rag.k", 3) and "got true" in e.value.message
    with pytest.raises(ConfigError, match="expected a number"):
        RAGConfig().replace(fusion_weight=False)
    # a key written twice: YAML keeps the last silently
    f.write_text("rag:\n  k: 5\n  variant: bm25\n  k: 7\n")
    with pytest.raises(ConfigError) as e:
        RAGConfig.from_yaml(f)
    assert (e.value.field, e.value.line) == ("rag.k", 4) and "lines 2 and 4" in e.value.message
    # bytes that are not UTF-8 (was a UnicodeDecodeError traceback)
    f.write_bytes(b"rag:\n  k: 5\n  prompt_id: caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        RAGConfig.from_yaml(f)
    assert e.value.line == 3 and "not UTF-8" in e.value.message
    # an unknown prompt id, even with the extractive generator that reads few of them
    with pytest.raises(ConfigError, match="unknown prompt 'nope'"):
        RAGConfig.from_dict({"prompt_id": "nope"})
    # a key beside `rag:` was ignored: a misplaced RAG key, or a typo of a section
    for text, key in [("rag:\n  k: 3\nk: 5\n", "k"), ("rag: {}\nindexs: {}\n", "indexs")]:
        f.write_text(text)
        with pytest.raises(ConfigError) as e:
            RAGConfig.from_yaml(f)
        assert e.value.field == key and "beside `rag:`" in e.value.message
    f.write_text("rag:\n  k: 3\nindexes:\n  lexical: bm25s\n")
    assert RAGConfig.from_yaml(f).k == 3
    with pytest.raises(ConfigError, match="is a directory"):
        RAGConfig.from_yaml(tmp_path)
    # malformed YAML in --set (was a yaml.ParserError traceback)
    assert main(["query", "--index", str(tmp_path), "--set", "k=[1", "q?"]) == 2
    assert "error: --set: 'k=[1': the value is not valid YAML" in capsys.readouterr().err
    assert main(["query", "--index", str(tmp_path), "--set", "k=true", "q?"]) == 2
    assert "k: expected a number, got true" in capsys.readouterr().err
