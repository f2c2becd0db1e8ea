"""Perturbation suite (rag.metrics.perturb): each perturbation on hand-made text, case
construction, and faithfulness dropping on hand-made and real HotpotQA cases."""

from __future__ import annotations

import random

import pytest

from rag.errors import ConfigError
from rag.metrics.perturb import (
    PERTURBATIONS,
    SourceItem,
    find_entities,
    hotpotqa_items,
    make_cases,
    negate,
    run_suite,
    swap_entity,
)
from rag.types import Context

EIFFEL = Context("eiffel", "Eiffel Tower",
                 "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was "
                 "completed in 1889 as the entrance arch of the World's Fair. Gustave Eiffel's "
                 "company designed and built the tower.")
NILE = Context("nile", "Nile", "The Nile is a major north-flowing river in northeastern Africa. "
                               "It flows into the Mediterranean Sea near Alexandria.")
ITEMS = [
    SourceItem("e", "When was the Eiffel Tower completed?",
               "The Eiffel Tower is a lattice tower in Paris. It was completed in 1889 as the "
               "entrance arch of the World's Fair.", (EIFFEL,), (NILE,), "hand"),
    SourceItem("n", "Where does the Nile flow?",
               "The Nile is a north-flowing river in Africa. It flows into the Mediterranean "
               "Sea near Alexandria.", (NILE,), (EIFFEL,), "hand"),
]


def test_negate():
    assert negate("The tower was completed in 1889.") == "The tower was not completed in 1889."
    assert negate("Eiffel designed it. He founded a company.") == \
        "Eiffel never designed it. He founded a company."
    assert negate("It was not built. Nothing else.") is None
    # the most grounded sentence is negated when contexts are given
    out = negate("You are right. It was completed in 1889 as the entrance arch.", [EIFFEL])
    assert out == "You are right. It was not completed in 1889 as the entrance arch."


def test_find_and_swap_entities():
    ents = find_entities("The tower in Paris was completed in 1889 by Gustave Eiffel.")
    text = "The tower in Paris was completed in 1889 by Gustave Eiffel."
    assert [(text[s:e], k) for s, e, k in ents] == [
        ("Paris", "name"), ("1889", "number"), ("Gustave Eiffel", "name")]
    rng = random.Random(0)
    text = "It was completed in 1889 in Paris."
    out = swap_entity(text, [EIFFEL], ["Rome", "Paris", "Eiffel"], rng)
    assert out == "It was completed in 1889 in Rome."
    num = swap_entity("It was completed in 1889.", [EIFFEL], [], random.Random(1))
    assert num is not None and num != "It was completed in 1889." and "1889" not in num
    assert swap_entity("no entities here.", [EIFFEL], ["Rome"], rng) is None


def test_make_cases_quota_kinds_and_determinism():
    cases = make_cases(ITEMS * 3, n=8, seed=0)
    assert [c.kind for c in cases].count("negation") == 2
    assert {c.kind for c in cases} == set(PERTURBATIONS)
    assert all(c.perturbed != c.original for c in cases)
    assert [c.perturbed for c in cases] == [c.perturbed for c in make_cases(ITEMS * 3, 8, 0)]
    added = next(c for c in cases if c.kind == "added_claim")
    assert added.perturbed.startswith(added.original)
    with pytest.raises(ConfigError) as e:
        make_cases(ITEMS, 4, kinds=("typo",))
    assert e.value.field == "kinds"


@pytest.fixture(scope="module")
def scorer():
    from rag.encoders import Encoder
    from rag.metrics.quality import QualityScorer

    return QualityScorer(Encoder.from_registry("minilm"))


def test_faithfulness_drops_on_hand_made_cases(scorer):
    cases = make_cases(ITEMS, n=8, seed=0)
    res = run_suite(scorer, cases)
    assert all(o == 1.0 for o in res.original)
    assert res.passed == [True] * len(cases), res.rows()
    assert res.pass_rate("negation") == 1.0


def test_faithfulness_drops_on_real_hotpotqa_cases(scorer):
    from tests.conftest import require_dataset

    from rag.corpus.hygiene import load_split

    ids = load_split("hotpotqa").ids("test")[:12]
    items = hotpotqa_items(require_dataset("hotpotqa/hotpot_dev_distractor_1100.jsonl"), ids)
    assert len(items) == 12 and all(len(it.contexts) == 2 and it.distractors for it in items)
    res = run_suite(scorer, make_cases(items, n=12, seed=0))
    assert len(res.cases) == 12
    assert res.pass_rate() >= 11 / 12, res.rows()
