"""Context compression (`RAGConfig.context_budget`, `rag.generation.context`): the generator
reads fewer tokens, the answer-bearing sentence stays, and configs without it keep their hash."""

import pytest

from rag.config import RAGConfig
from rag.corpus import Corpus
from rag.errors import ConfigError
from rag.generation.context import compress
from rag.pipeline import Pipeline
from rag.types import Hit, Passage
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace

HEKLA = ("Hekla is a stratovolcano in the south of Iceland. The volcano has erupted more than "
         "twenty times since the year 874. Its 1104 eruption buried farms across the valley of "
         "Thjorsardalur under tephra. Sheep graze on the lower slopes in the summer months, and "
         "hikers climb the mountain from a car park on its northern side.")
QUESTION = "Which valley did the 1104 eruption of Hekla bury?"


def test_compress_keeps_the_answer_sentence_and_cuts_tokens():
    out = compress(QUESTION, HEKLA, 20)
    assert "Thjorsardalur" in out
    assert len(out.split()) <= 20 < len(HEKLA.split())
    assert "Sheep" not in out  # no question word: the first sentence to go


def test_compress_keeps_order_fits_unchanged_and_always_one_sentence():
    two = compress(QUESTION, HEKLA, 40)
    assert two.index("stratovolcano") < two.index("Thjorsardalur")  # original order
    assert len(two.split()) <= 40
    assert compress(QUESTION, HEKLA, 1000) == HEKLA
    one = compress(QUESTION, HEKLA, 1)  # below the best sentence's length: that sentence
    assert one.startswith("Its 1104 eruption") and one.endswith("tephra.")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="budget"):
            compress(QUESTION, HEKLA, bad)


class _Lexical:
    def search(self, query, top_n=10):
        return [Hit(1.0, "p1"), Hit(0.5, "p2")][:top_n]


class _Indexes:
    encoder_name = "none"

    def __init__(self):
        self.corpus = Corpus([Passage("p1", HEKLA, "Hekla"),
                              Passage("p2", "Katla is a volcano under the Myrdalsjokull glacier. "
                                            "It last erupted in 1918.", "Katla")])

    def bm25(self, backend="tantivy"):
        return _Lexical()


def test_pipeline_hands_fewer_tokens_with_the_same_answer():
    cfg = RAGConfig(variant="bm25", k=2)
    whole = Pipeline(_Indexes(), cfg).run(QUESTION)
    cut = Pipeline(_Indexes(), cfg.replace(context_budget=20)).run(QUESTION)
    assert "Thjorsardalur" in whole.text and cut.text == whole.text
    assert cut.tokens_in < whole.tokens_in
    assert sum(len(c.text.split()) for c in cut.contexts) == cut.tokens_in - len(
        QUESTION.split())
    with pytest.raises(ValueError, match="needs the question"):
        Pipeline(_Indexes(), cfg.replace(context_budget=20)).contexts([Hit(1.0, "p1")])


def test_default_hash_unchanged_and_the_field_is_part_of_identity_when_set():
    assert "context_budget" not in RAGConfig().canonical_json()
    assert RAGConfig(context_budget=None).config_hash == RAGConfig().config_hash
    assert RAGConfig(context_budget=24).config_hash != RAGConfig().config_hash
    with pytest.raises(ConfigError):
        RAGConfig.from_dict({"context_budget": 0})


def test_space_head_pinned_by_default_and_open_when_listed():
    base = TunerSettings.defaults()
    pinned = ConfigSpace(base)
    assert "context_budget" not in pinned.extra_heads
    b = pinned.base  # the space's canonical default is the static default, same hash
    assert pinned.make(b.variant, b.k, "off", b.fusion_weight, b.prompt_id) == b
    assert b.context_budget is None
    small = base.with_overrides(k_grid=[2, 3], discrete={
        **base.discrete.model_dump(), "variant": ["bm25"], "rerank": ["off"],
        "prompt_id": ["cite_concise"], "context_budget": [None, 24]},
        bounds={**base.bounds.model_dump(), "mmr_lambda": {"min": 1.0, "max": 1.0}})
    space = ConfigSpace(small)
    assert "context_budget" in space.extra_heads
    grid = list(space.grid())
    assert space.size() == len(grid) == 4
    assert sorted((c.k, c.context_budget or 0) for c in grid) == [(2, 0), (2, 24), (3, 0),
                                                                   (3, 24)]
    for c in grid:
        assert space.from_params(space.to_params(c)) == c
