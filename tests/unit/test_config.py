"""RAGConfig: bounds, unknown keys and YAML loading name the offending field; hashing is stable."""

from pathlib import Path

import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError


def test_default_yaml_loads_and_matches_defaults():
    cfg = RAGConfig.from_yaml(Path(__file__).resolve().parents[2] / "configs/rag/default.yaml")
    assert cfg == RAGConfig()  # the documented file and the code defaults must not drift


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"kk": 3}, "rag.kk"),
        ({"k": 0}, "rag.k"),
        ({"k": 33}, "rag.k"),
        ({"fusion_weight": 1.5}, "rag.fusion_weight"),
        ({"variant": "sparse"}, "rag.variant"),
        ({"n_candidates": 101}, "rag.n_candidates"),
        ({"k": 20, "n_candidates": 10}, "rag.n_candidates"),
        ({"rerank": "cosine", "k": 10, "rerank_depth": 5}, "rag.rerank_depth"),
    ],
)
def test_bad_values_name_the_field(changes, field):
    with pytest.raises(ConfigError) as exc:
        RAGConfig.from_dict(changes)
    assert exc.value.field == field


def test_yaml_unknown_key_and_missing_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("rag:\n  variant: bm25\n  topk: 5\n")
    with pytest.raises(ConfigError, match="rag.topk: unknown key"):
        RAGConfig.from_yaml(p)
    with pytest.raises(ConfigError, match="does not exist"):
        RAGConfig.from_yaml(tmp_path / "nope.yaml")
    p.write_text("rag: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RAGConfig.from_yaml(p)


def test_hash_is_stable_and_sensitive():
    a = RAGConfig(variant="bm25", k=5)
    b = RAGConfig.from_dict({"k": 5, "variant": "bm25"})
    assert a.config_hash == b.config_hash and len(a.config_hash) == 12
    assert a.replace(k=6).config_hash != a.config_hash
    assert a.replace(fusion_weight=0.5000001).config_hash != a.config_hash
    # frozen: a config cannot change under a hash that was already logged
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its own ValidationError
        a.k = 7


def test_yaml_round_trip(tmp_path):
    cfg = RAGConfig(variant="graph", k=7, mmr_lambda=0.4, prompt_id="cite_verbose")
    p = tmp_path / "c.yaml"
    p.write_text(cfg.to_yaml())
    assert RAGConfig.from_yaml(p) == cfg


def test_rerank_mix_is_optional_in_the_identity():
    """A field added after configs were hashed leaves every existing hash as it was while unset
    (committed results, tuner tables and Serve deployments are keyed by these hashes)."""
    assert RAGConfig().config_hash == "76f8ced5e221"
    assert RAGConfig(variant="bm25", k=3, rerank="cosine").config_hash == "4d42f5adeb94"
    assert RAGConfig(rerank_mix=0.5).config_hash != RAGConfig().config_hash
    assert RAGConfig(rerank_mix=0.5).config_hash != RAGConfig(rerank_mix=0.25).config_hash
    with pytest.raises(ConfigError) as exc:
        RAGConfig.from_dict({"rerank_mix": 1.5})
    assert exc.value.field == "rag.rerank_mix"
