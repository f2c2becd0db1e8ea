"""Learners proven on the world where configuration choices matter (`synthetic-choices`), at a
small size so each test stays well under a minute on 2 cores: the world's families need
different configs and a per-query oracle stands clearly above the best static config; the
supervised router captures most of that headroom on the test split.

The small world is `make_choice_world(per_family=PER_FAMILY)` (the bench's world has 50 per
family): `load_dataset("synthetic-choices")` builds it through a monkeypatched generator, so
the tuner, the evaluator's lazy rows and the router run exactly as on the full world. The
full-size numbers are `bench/learners.py`'s."""

import numpy as np
import pytest
from bench.learners import DATASET, TARGET, family_table, headroom_captured

from rag.corpus import synthetic_choices
from rag.corpus.synthetic_choices import FAMILIES
from rl.kernel.settings import TunerSettings
from rl.routing.train import fit_router, prepare
from rl.stats.headroom import best_static, pick

PER_FAMILY = 15
"""Questions per family of the small world (90: half test, the rest split train / valid)."""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    full = synthetic_choices.make_choice_world
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic_choices, "make_choice_world",
                   lambda seed=0, per_family=PER_FAMILY: full(seed, per_family))
        return prepare(DATASET, TunerSettings.defaults(),
                       tmp_path_factory.mktemp("learners") / "p", seed=0)


def _families(prep, role):
    split, idx = prep.parts[role]
    return [prep.ev.data.examples(split)[int(i)].category for i in idx]


def test_the_small_world_is_the_generated_one(prepared):
    p = prepared
    assert sum(len(i) for _, i in p.parts.values()) == PER_FAMILY * len(FAMILIES)
    assert set(_families(p, "test")) == set(FAMILIES)


def test_families_need_different_configs_and_the_oracle_stands_above_static(prepared):
    p = prepared
    table = family_table(p.M["test"]["Q"], _families(p, "test"), p.names)
    Q = np.array(list(table.values()))  # arms × families
    winners = {p.names[int(j)] for j in np.argmax(Q, axis=0)}
    assert len(winners) >= 3, winners  # no one arm wins most families
    # in most families the best arm is far above the worst: choices matter there
    # (the lexical family is not one: every retriever finds the code's passage)
    spread = dict(zip(FAMILIES, Q.max(axis=0) - Q.min(axis=0), strict=True))
    assert sum(v >= 0.3 for v in spread.values()) >= 4, spread
    R = p.M["test"]["R"]
    static = best_static(p.M["valid"]["R"])
    assert R.max(axis=1).mean() - R[:, static].mean() >= 0.10


def test_supervised_router_captures_most_of_the_oracles_headroom(prepared):
    p = prepared
    router, _ = fit_router(p, seed=0)
    picks = router.choose(p.X["test"])
    R = p.M["test"]["R"]
    value, lo, _ = headroom_captured(R, pick(R, picks), best_static(p.M["valid"]["R"]))
    assert value >= TARGET, (value, lo)


def test_headroom_captured_is_one_for_the_oracle_and_zero_for_the_static_arm():
    R = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.2]])
    assert headroom_captured(R, R.max(axis=1), 0)[0] == pytest.approx(1.0)
    assert headroom_captured(R, R[:, 0], 0)[0] == pytest.approx(0.0)
    assert headroom_captured(R, R[:, 1], 0)[0] == pytest.approx((0.4 - 0.5) / (2.5 / 3 - 0.5))
    with pytest.raises(ValueError, match="no headroom"):
        headroom_captured(np.ones((3, 2)), np.ones(3), 0)


def test_the_arm_layout_and_the_table_world_are_lookups_over_the_same_configs():
    from rl.routing.heads import ArmLayout
    from rl.routing.worlds import TableWorld

    base = TunerSettings.defaults().base_config()
    arms = [base.replace(k=k) for k in (2, 4, 8)]
    layout = ArmLayout(arms, TunerSettings.defaults())
    assert layout.action_space()["arm"].n == 3 and layout.names == ("arm",)
    for j, c in enumerate(arms):
        assert layout.encode(c) == ({"arm": j}, True)
        assert layout.decode({"arm": np.array([j])}).config_hash == c.config_hash
    other = base.replace(k=16)
    with pytest.raises(ValueError, match="none of the layout's 3 arms"):
        layout.encode(other)
    R = np.arange(6.0).reshape(2, 3)
    world = TableWorld(R, R / 10, R * 100, arms, cost_ref=50.0)
    o = world.outcome(1, arms[2])
    assert (o.reward, o.quality, o.cost) == (5.0, 0.5, 10.0)
    assert [x.reward for x in world.outcomes([arms[0], arms[1]])] == [0.0, 4.0]
    with pytest.raises(ValueError, match="not a column"):
        world.outcome(0, other)
    with pytest.raises(ValueError, match="queries x 3"):
        TableWorld(R[:, :2], R, R, arms, 50.0)
