"""Distilled reward model (rag.metrics.reward_model): features with known values, Bradley–Terry
fit on preferences with a known rule, versioned save/load with integrity checks, throughput."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag.errors import ConfigError, DataError
from rag.generation.prompts import INSUFFICIENT
from rag.metrics.reward_model import FEATURES, RewardModel, answer_features, load_reward_model
from rag.types import Answer, Context

EIFFEL = Context("eiffel", "Eiffel Tower",
                 "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was "
                 "completed in 1889 as the entrance arch of the World's Fair.")
Q = "When was the Eiffel Tower completed?"
F = {name: i for i, name in enumerate(FEATURES)}


def test_features_known_values():
    copied = answer_features(Q, [EIFFEL], "It was completed in 1889 as the entrance arch of "
                                          "the World's Fair.")
    assert copied[F["lex_support"]] == 1.0 and copied[F["sent_support"]] == 1.0
    assert copied[F["answer_in_context"]] == 1.0 and copied[F["missing_entities"]] == 0
    made_up = answer_features(Q, [EIFFEL], "It was completed in 1925 by Napoleon Bonaparte.")
    assert made_up[F["missing_entities"]] == 3 and made_up[F["missing_entity_frac"]] == 1.0
    assert made_up[F["answer_in_context"]] == 0.0
    abst = answer_features(Q, [EIFFEL], INSUFFICIENT)
    assert abst[F["abstain"]] == 1.0 and abst[F["lex_support"]] == 0.0
    neg = answer_features(Q, [EIFFEL], "The tower was not completed in 1889.")
    assert neg[F["negation_unmatched"]] == 1.0
    fact = answer_features(Q, ["plain text context about 1889"], "1889")
    assert fact[F["factoid"]] == 1.0 and fact[F["answer_in_context"]] == 1.0
    assert answer_features(Q, [EIFFEL], "Yes")[F["yes_no"]] == 1.0
    with pytest.raises(ConfigError):
        answer_features(Q, [42], "x")


def _pairs(rng, n):
    """Preference rule: more lexical support wins; other features are noise."""
    a, b = rng.random((n, len(FEATURES))), rng.random((n, len(FEATURES)))
    win = a[:, F["lex_support"]] > b[:, F["lex_support"]]
    return np.where(win[:, None], a, b), np.where(win[:, None], b, a)


def test_fit_recovers_the_rule_and_generalises():
    rng = np.random.default_rng(0)
    w_tr, l_tr = _pairs(rng, 400)
    rm = RewardModel.fit(w_tr, l_tr)
    assert int(np.argmax(np.abs(rm.weights))) == F["lex_support"] and rm.weights[F["lex_support"]] > 0
    w_te, l_te = _pairs(rng, 400)
    assert rm.agreement(w_te, l_te, np.ones(400)) > 0.95
    assert rm.agreement(l_te, w_te, np.ones(400)) < 0.05
    with pytest.raises(ConfigError):
        RewardModel.fit(w_tr[:, :3], l_tr[:, :3])
    with pytest.raises(ConfigError):
        RewardModel.fit(np.zeros((0, len(FEATURES))), np.zeros((0, len(FEATURES))))


def _trained() -> RewardModel:
    rng = np.random.default_rng(1)
    return RewardModel.fit(*_pairs(rng, 200), manifest={"teacher": "unit-test"})


def test_score_api_and_batch_equal_single():
    rm = _trained()
    good = "It was completed in 1889 as the entrance arch of the World's Fair."
    bad = "It was built by Napoleon in Rome."
    s = rm.score_batch([(Q, [EIFFEL], good), (Q, [EIFFEL], bad)])
    # a 2-row and a 1-row matrix product may differ in the last bits
    assert s[0] == pytest.approx(rm.score(Q, [EIFFEL], good), rel=1e-12, abs=1e-12)
    assert s[1] == pytest.approx(rm.score(Q, [EIFFEL], bad), rel=1e-12, abs=1e-12)
    assert s[0] > s[1] and rm.prefer(Q, [EIFFEL], good, bad) > 0.5
    ans = Answer("q", Q, good, (), (EIFFEL,), (), {}, 0, 0, "cfg")
    assert rm.score_answer(ans) == pytest.approx(s[0], rel=1e-12, abs=1e-12)
    assert rm.score_batch([]).shape == (0,)


def test_save_load_versions_and_integrity(tmp_path):
    rm = _trained()
    p1 = rm.save(tmp_path, "rm")
    p2 = _trained().save(tmp_path, "rm")
    assert (p1.name, p2.name) == ("v1", "v2")
    man = json.loads((p2 / "manifest.json").read_text())
    assert man["version"] == 2 and man["features"] == list(FEATURES)
    assert man["teacher"] == "unit-test" and "created" in man and "weights_sha256" in man
    by_name = load_reward_model("rm", root=tmp_path)
    assert by_name.manifest["version"] == 2
    by_path = load_reward_model(p1)
    assert np.array_equal(by_path.weights, rm.weights)
    assert load_reward_model("rm/v1", root=tmp_path).manifest["version"] == 1
    items = [(Q, [EIFFEL], "It was completed in 1889."), (Q, [EIFFEL], INSUFFICIENT)]
    assert np.array_equal(by_path.score_batch(items), rm.score_batch(items))
    # tampering and mismatches are refused, naming the file
    raw = bytearray((p1 / "weights.npz").read_bytes())
    raw[-30] ^= 0xFF
    (p1 / "weights.npz").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="sha256"):
        load_reward_model(p1)
    man["features"] = man["features"][:-1]
    (p2 / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DataError, match="features"):
        load_reward_model(p2)
    with pytest.raises(DataError):
        load_reward_model("nope", root=tmp_path)
    with pytest.raises(ConfigError):
        rm.save(tmp_path, "../evil")


def test_name_lookup_search_path_committed_model_and_env_override(tmp_path, monkeypatch):
    """`quality-rm` resolves from a clean checkout (the committed model under
    src/rag/bundled/reward_models), a model in the cache comes first, and
    $RAGPILOT_REWARD_MODELS wins over both."""
    from pathlib import Path

    import rag.metrics.reward_model as rmod

    monkeypatch.delenv("RAGPILOT_REWARD_MODELS", raising=False)
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))
    committed = Path(__file__).resolve().parents[2] / "src/rag/bundled/reward_models/quality-rm"
    assert committed.parent == rmod.BUNDLED_ROOT and (committed / "v1/manifest.json").exists()
    assert rmod.search_roots() == [tmp_path / "cache/reward_models", rmod.BUNDLED_ROOT]
    newest = max((d for d in committed.iterdir() if d.name.startswith("v")),
                 key=lambda d: int(d.name[1:]))
    default = load_reward_model("quality-rm")  # the newest committed version
    assert default.path == newest and default.manifest["name"] == "quality-rm"
    assert rmod.load_default().path == default.path
    assert load_reward_model("quality-rm/v1").path == committed / "v1"
    # a model saved to the cache (the default save root) shadows the committed one
    cached = _trained().save(name="quality-rm")
    assert cached == tmp_path / "cache/reward_models/quality-rm/v1"
    assert load_reward_model("quality-rm").path == cached
    # the environment variable wins
    env_root = tmp_path / "env"
    mine = _trained().save(env_root, "quality-rm")
    _trained().save(env_root, "quality-rm")
    monkeypatch.setenv("RAGPILOT_REWARD_MODELS", str(env_root))
    assert rmod.search_roots()[0] == env_root
    assert load_reward_model("quality-rm").path == env_root / "quality-rm/v2"
    assert load_reward_model("quality-rm/v1").path == mine
    assert rmod.find_reward_model("quality-rm") == env_root / "quality-rm"
    # nothing installed anywhere: find -> None, load_default -> DataError naming the places
    monkeypatch.setattr(rmod, "BUNDLED_ROOT", tmp_path / "no-bundle")
    monkeypatch.setenv("RAGPILOT_REWARD_MODELS", str(tmp_path / "empty"))
    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "empty-cache"))
    assert rmod.find_reward_model() is None
    with pytest.raises(DataError, match="no saved reward model"):
        rmod.load_default()


def test_scores_a_cold_batch_of_1000_answers():
    """200 questions x 5 answers over fresh passages (passage parsing included, cold): one
    finite score per answer, in order. Its speed (the >= 500 answers per CPU second target) is
    a benchmark's to measure, not asserted here: a timed assertion
    failed on this shared 2-core machine under load while passing alone."""
    from rag.metrics.support import _passage

    rm = _trained()
    rng = np.random.default_rng(2)
    words = [f"w{i}" for i in range(3000)]
    items = []
    for qn in range(200):
        ctx = [Context(f"c{qn}-{k}", f"Title {qn} {k}",
                       " ".join(f"{' '.join(rng.choice(words, 12))}." for _ in range(5)))
               for k in range(5)]
        for a in range(5):
            items.append((f"question {qn} about {words[qn]}?", ctx,
                          " ".join(rng.choice(words, 15)) + f" in {1900 + a}."))
    _passage.cache_clear()
    scores = rm.score_batch(items)
    assert scores.shape == (1000,) and np.isfinite(scores).all()
    assert np.allclose(scores[:5], rm.score_batch(items[:5]))  # a batch scores like its parts
