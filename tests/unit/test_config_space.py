"""The tuner's config space (issue 18): its size, canonical configs, the searchers' and RLlib's
addresses for it, and the two RAGConfig fields it added (query formulation, abstain threshold).
Pure and fast: no Ray runtime, no model weights."""

import itertools

import numpy as np
import pytest

from rag.config import RAGConfig
from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.generation.extractive import ExtractiveReader
from rag.generation.prompts import INSUFFICIENT
from rag.pipeline import Pipeline
from rag.query_formulation import formulate_query
from rag.types import Context, Hit, Passage
from rl.kernel.settings import TunerSettings
from rl.kernel.space import GRID_LIMIT, ConfigSpace


@pytest.fixture(scope="module")
def default_space():
    return ConfigSpace(TunerSettings.defaults())


def _small(conversational: bool = True, **changes) -> ConfigSpace:
    """Every extra head with 2-3 values; k values that make rerank depths collide (25 raises
    10 to 25; 32 raises 10 and 30 to 32)."""
    policy = TunerSettings.defaults().with_overrides(**{
        "k_grid": [3, 25, 32], "fusion_step": 0.5, "fusion_grid": 0.5, "mmr_step": 0.5,
        "rerank_mix_step": 0.25, "abstain_step": 0.1,
        "bounds": {"k": {"min": 1, "max": 32}, "fusion_weight": {"min": 0.0, "max": 1.0},
                   "mmr_lambda": {"min": 0.5, "max": 1.0}, "rerank_mix": {"min": 0.5, "max": 1.0},
                   "abstain_threshold": {"min": 0.4, "max": 0.6}},
        "discrete": {"variant": ["bm25", "hybrid"], "rerank": ["off", "on"],
                     "prompt_id": ["cite_concise", "cite_concise_abstain"],
                     "normalisation": ["minmax", "rrf"], "rerank_depth": [10, 30, 50],
                     "query_formulation": ["last_turn", "all_user"]}, **changes})
    return ConfigSpace(policy, conversational=conversational)


# ---- size -------------------------------------------------------------------------------------
def test_default_space_has_over_a_million_configs(default_space):
    assert default_space.size() >= 10**6
    conv = ConfigSpace(default_space.policy, conversational=True)
    assert conv.size() == 3 * default_space.size()  # three query formulations


def test_size_is_the_number_of_distinct_configs():
    space = _small()
    h = space
    raw = set()
    for v, k, rr, w, p, nm, m, d, mx, a, q in itertools.product(
            h.variants, h.ks, h.reranks, h.w.values(), h.prompts, h.norms, h.mmr.values(),
            h.depths, h.mix.values(), h.abstain.values(), h.formulations):
        raw.add(h.make(v, k, rr, w, p, normalisation=nm, mmr_lambda=m, rerank_depth=d,
                       rerank_mix=mx, abstain_threshold=a, query_formulation=q).config_hash)
    grid = [c.config_hash for c in space.grid()]
    assert space.size() == len(raw) == len(grid) == len(set(grid))


def test_grid_refuses_a_space_too_large_to_enumerate(default_space):
    with pytest.raises(ConfigError) as e:
        next(default_space.grid())
    msg = str(e.value)
    assert f"{default_space.size():,}" in msg and f"{GRID_LIMIT:,}" in msg


def test_legacy_space_is_the_old_504_configs():
    space = ConfigSpace(TunerSettings.defaults().with_legacy_space())
    assert space.extra_heads == () and len(list(space.grid())) == 504


# ---- canonicalisation -------------------------------------------------------------------------
def test_heads_that_do_not_act_leave_the_hash_alone():
    s = _small(conversational=False)
    same = [
        # bm25: fusion weight and normalisation do not act
        (("bm25", 3, "off", 0.0, "cite_concise"), {"normalisation": "minmax"},
         ("bm25", 3, "off", 1.0, "cite_concise"), {"normalisation": "rrf"}),
        # rerank off: depth and mix do not act
        (("hybrid", 3, "off", 0.5, "cite_concise"), {"rerank_depth": 10, "rerank_mix": 0.5},
         ("hybrid", 3, "off", 0.5, "cite_concise"), {"rerank_depth": 50, "rerank_mix": 0.75}),
        # no *_abstain prompt: the threshold does not act
        (("bm25", 3, "off", 0.5, "cite_concise"), {"abstain_threshold": 0.4},
         ("bm25", 3, "off", 0.5, "cite_concise"), {"abstain_threshold": 0.6}),
        # single-turn data: the formulation does not act
        (("bm25", 3, "off", 0.5, "cite_concise"), {"query_formulation": "all_user"},
         ("bm25", 3, "off", 0.5, "cite_concise"), {"query_formulation": "last_turn"}),
        # a depth under k is raised to k
        (("bm25", 32, "on", 0.5, "cite_concise"), {"rerank_depth": 10},
         ("bm25", 32, "on", 0.5, "cite_concise"), {"rerank_depth": 30}),
    ]
    for a, ha, b, hb in same:
        assert s.make(*a, **ha).config_hash == s.make(*b, **hb).config_hash, (a, ha, hb)
    on = s.make("bm25", 5, "on", 0.5, "cite_concise", rerank_mix=1.0)
    assert on.rerank_mix is None  # 1.0 = the reranker's own order
    abst = s.make("bm25", 5, "off", 0.5, "cite_concise_abstain", abstain_threshold=0.5)
    assert abst.abstain_threshold is None  # the reader's default
    assert s.make("bm25", 5, "off", 0.5, "cite_concise").query_formulation is None


def test_heads_that_act_change_the_hash():
    s = _small()
    base = ("hybrid", 3, "on", 0.5, "cite_concise_abstain")
    ref = s.make(*base).config_hash
    for head, value in (("normalisation", "rrf"), ("mmr_lambda", 0.5), ("rerank_depth", 50),
                        ("rerank_mix", 0.5), ("abstain_threshold", 0.6),
                        ("query_formulation", "all_user")):
        assert s.make(*base, **{head: value}).config_hash != ref, head
    assert s.make("hybrid", 3, "on", 0.0, base[4]).config_hash != ref


def test_new_fields_unset_keep_old_hashes():
    cfg = RAGConfig()
    assert "abstain_threshold" not in cfg.canonical_json()
    assert "query_formulation" not in cfg.canonical_json()
    assert cfg.replace(query_formulation="all_user").config_hash != cfg.config_hash


# ---- search addresses ----------------------------------------------------------------------------
def test_round_trips_config_params_action():
    for space in (_small(), ConfigSpace(TunerSettings.defaults())):
        rng = np.random.default_rng(0)
        act_space = space.action_space()
        for _ in range(200):
            cfg = space.sample(rng)
            assert space.from_params(space.to_params(cfg)) == cfg
            assert space.from_params(space.to_params(cfg, complete=True)) == cfg
            a = space.to_action(cfg)
            assert act_space.contains(a)
            assert space.to_config(a) == cfg
            again = space.to_action(space.to_config(a))
            assert again.keys() == a.keys()
            for key in a:
                assert np.allclose(again[key], a[key]), key
            assert len(space.one_hot(cfg)) == len(space.one_hot(space.base))


def test_from_params_errors():
    s = _small()
    with pytest.raises(ConfigError, match="params.bogus"):
        s.from_params({"bogus": 1})
    with pytest.raises(ConfigError, match="params.normalisation"):
        s.from_params({"normalisation": "softmax"})
    with pytest.raises(ConfigError, match="params.k"):
        s.from_params({"k": 4})


def test_tune_param_space_points_map_to_configs():
    s = _small()
    space = s.tune_param_space()
    assert set(space) == {"variant", "k", "rerank", "fusion_weight", "prompt", "normalisation",
                          "mmr_lambda", "rerank_depth", "rerank_mix", "abstain_threshold",
                          "query_formulation"}
    for _ in range(50):
        cfg = s.from_params({name: dom.sample() for name, dom in space.items()})
        assert cfg.k in s.ks and cfg.mmr_lambda in s.mmr.values()


def test_pinned_heads_leave_the_spaces():
    s = _small(conversational=False,
               bounds={"k": {"min": 1, "max": 32}, "fusion_weight": {"min": 0.0, "max": 1.0},
                       "mmr_lambda": {"min": 0.7, "max": 0.7},
                       "rerank_mix": {"min": 1.0, "max": 1.0},
                       "abstain_threshold": {"min": 0.8, "max": 0.8}})
    assert s.extra_heads == ("normalisation", "rerank_depth")
    assert not {"mmr_lambda", "rerank_mix", "abstain_threshold",
                "query_formulation"} & (set(s.tune_param_space()) | set(s.action_space()))
    rng = np.random.default_rng(1)
    for _ in range(50):
        c = s.sample(rng)
        assert c.mmr_lambda == 0.7 and c.rerank_mix is None and c.query_formulation is None
        assert c.abstain_threshold == (0.8 if c.prompt_id.endswith("_abstain") else None)


def test_optuna_suggest_asks_conditional_heads_only_where_they_act():
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = _small()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        cfg = s.suggest(trial)
        assert ("fusion_weight" in trial.params) == (cfg.variant == "hybrid")
        assert ("rerank_depth" in trial.params) == (cfg.rerank != "none")
        assert ("abstain_threshold" in trial.params) == cfg.prompt_id.endswith("_abstain")
        assert s.from_params(trial.params) == cfg
        study.tell(trial, 0.0)


def test_delta_mode_keeps_extra_heads_absolute():
    s = _small(action_mode="delta")
    cur = s.make("hybrid", 25, "on", 0.5, "cite_concise")
    a = s.to_action(cur)
    a.update(k=2, fusion_weight=np.array([-0.25], dtype=np.float32),
             rerank_depth=s.depths.index(50), normalisation=s.norms.index("rrf"))
    nxt = s.to_config(a, cur)
    assert (nxt.k, nxt.fusion_weight, nxt.rerank_depth, nxt.normalisation) == (
        32, 0.0, 50, "rrf")
    assert s.action_space()["k"].n == 3


# ---- query formulation and abstain threshold -----------------------------------------------------
HISTORY = ({"role": "user", "text": "Tell me about volcanoes."},
           {"role": "agent", "text": "Volcanoes erupt lava."},
           {"role": "user", "text": "Which one is in Iceland?"})


def test_query_formulation_on_a_toy_history():
    q = "How tall is it?"
    assert formulate_query(q, HISTORY, None) == q
    assert formulate_query(q, HISTORY, "last_turn") == q
    assert formulate_query(q, HISTORY, "last_two_user") == "Which one is in Iceland?\n" + q
    assert formulate_query(q, HISTORY, "all_user") == (
        "Tell me about volcanoes.\nWhich one is in Iceland?\n" + q)
    assert formulate_query(q, (), "all_user") == q
    assert formulate_query(q, HISTORY, "all_user", max_chars=len(q) + 30).startswith("Which")
    with pytest.raises(ValueError):
        formulate_query(q, HISTORY, "rewrite")


class _Lexical:
    def __init__(self, ids):
        self.ids, self.queries = ids, []

    def search(self, query, top_n=10):
        self.queries.append(query)
        return [Hit(1.0 - i / 10, pid) for i, pid in enumerate(self.ids[:top_n])]


class _Indexes:
    encoder_name = "none"

    def __init__(self, passages):
        self.corpus = Corpus(passages)
        self.lexical = _Lexical([p.id for p in passages])

    def bm25(self, backend="tantivy"):
        return self.lexical


def test_pipeline_retrieves_with_the_formulation_and_answers_the_question():
    idx = _Indexes([Passage("p1", "Hekla is a volcano in Iceland. It is 1491 metres tall.",
                            "Hekla")])
    cfg = RAGConfig(variant="bm25", k=1, query_formulation="last_two_user")
    ans = Pipeline(idx, cfg).run("How tall is it?", history=HISTORY)
    assert idx.lexical.queries[-1] == "Which one is in Iceland?\nHow tall is it?"
    assert ans.question == "How tall is it?"
    Pipeline(idx, cfg.replace(query_formulation=None)).run("How tall is it?", history=HISTORY)
    assert idx.lexical.queries[-1] == "How tall is it?"


def test_abstain_threshold_changes_abstention():
    # the best sentence holds 2 of the question's 4 content words: coverage 0.5
    ctx = [Context(id="p1", title="", text="Hekla erupted in 1104.", score=1.0)]
    q = "When did Hekla erupt near Reykjavik harbour?"
    reader = ExtractiveReader()
    cov = reader.coverage(q, ctx)
    assert 0.0 < cov < 1.0
    low = reader.generate(q, ctx, "cite_concise_abstain", abstain_threshold=cov - 0.1)
    high = reader.generate(q, ctx, "cite_concise_abstain", abstain_threshold=cov + 0.1)
    assert low.text != INSUFFICIENT and high.text == INSUFFICIENT
    # other prompts never abstain on the threshold
    assert reader.generate(q, ctx, "cite_concise", abstain_threshold=1.0).text != INSUFFICIENT
    # through the pipeline: the config's threshold reaches the reader
    idx = _Indexes([Passage("p1", "Hekla erupted in 1104.", "")])
    cfg = RAGConfig(variant="bm25", k=1, prompt_id="cite_concise_abstain")
    texts = [Pipeline(idx, cfg.replace(abstain_threshold=t)).run(q).text
             for t in (cov - 0.1, cov + 0.1)]
    assert texts[0] != INSUFFICIENT and texts[1] == INSUFFICIENT


def test_to_params_refuses_a_config_the_space_cannot_express():
    s = _small()
    with pytest.raises(ConfigError, match="not a config of this space"):
        s.to_params(s.base.replace(k=4))  # k 4 is not among [3, 25, 32]
    with pytest.raises(ConfigError, match="not a config of this space"):
        s.to_params(s.base.replace(n_candidates=80))  # a field no head sets


def test_generator_head_and_the_abstain_threshold_only_for_the_extractive_reader():
    gens = ["extractive", "smollm2-135m-instruct"]
    policy = TunerSettings.defaults().with_overrides(
        k_grid=[5], fusion_step=0.5, abstain_step=0.3,
        discrete={"variant": ["bm25"], "rerank": ["off"],
                  "prompt_id": ["cite_concise", "cite_concise_abstain"], "generator": gens},
        bounds={"mmr_lambda": {"min": 1.0, "max": 1.0}, "abstain_threshold":
                {"min": 0.2, "max": 0.8}})
    s = ConfigSpace(policy)
    assert s.extra_heads == ("abstain_threshold", "generator")
    # extractive: 1 + 3 thresholds (0.2, 0.5 -> None, 0.8); the model: 2 prompts
    assert s.size() == len(list(s.grid())) == 4 + 2
    model = [s.make("bm25", 5, "off", 0.5, "cite_concise_abstain", generator=gens[1],
                    abstain_threshold=t) for t in (0.2, 0.8)]
    assert model[0] == model[1] and model[0].abstain_threshold is None
    assert model[0].generator == gens[1]
    assert s.from_params(s.to_params(model[0])) == model[0]
