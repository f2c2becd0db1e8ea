"""The threshold cascade (`rl.routing.cascade`) on a small generated world where configuration
choices matter (`synthetic-choices`, 12 questions per family, as tests/test_learners.py): at
equal cost (the best static config's mean tokens on valid) it answers the test split better
than the best static config, and its escalation rate moves with τ. The full-size numbers are
`bench/cascade.py`'s."""

import numpy as np
import pytest
from bench.learners import DATASET

from rag.corpus import synthetic_choices
from rag.errors import ConfigError
from rag.metrics.signals import AnswerSignals
from rl.kernel.settings import TunerSettings
from rl.routing.cascade import (
    SIGNAL_NAMES,
    Calibrator,
    ThresholdCascade,
    cheap_candidates,
    choose_tau,
    outcomes,
    role_features,
    select_cascade,
    with_abstention,
)
from rl.routing.train import prepare
from rl.stats.headroom import best_static

PER_FAMILY = 12


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The prepared small world, its matrices with the abstention column and their arm names,
    the best static arm, the equal-cost budget, and the attempt features ([query features,
    attempt signals]) of each cheap candidate per role."""
    full = synthetic_choices.make_choice_world
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic_choices, "make_choice_world",
                   lambda seed=0, per_family=PER_FAMILY: full(seed, per_family))
        prep = prepare(DATASET, TunerSettings.defaults(),
                       tmp_path_factory.mktemp("cascade") / "p", seed=0)
        static = best_static(prep.M["valid"]["R"])
        budget = float(prep.M["valid"]["T"][:, static].mean())
        sig = AnswerSignals()
        Z = {c: role_features(prep, c, sig) for c in cheap_candidates(prep.M["valid"], budget)}
        for z in Z.values():
            for role, (_, idx) in prep.parts.items():
                assert z[role].shape == (len(idx), prep.X[role].shape[1] + len(SIGNAL_NAMES))
        M, names = with_abstention(prep.ev, prep.configs[0], prep.M, prep.parts, prep.names)
        return prep, M, names, static, budget, Z


def test_the_cascade_at_equal_cost_beats_the_best_static_quality(world):
    prep, M, names, static, budget, Z = world
    cas = select_cascade(M, Z, names, budget, seed=0)
    assert cas.valid["tokens"] <= budget + 1e-9
    test = M["test"]
    esc = cas.escalate(Z[cas.cheap]["test"])
    got = outcomes(test, cas.cheap, cas.strong, esc)
    gain = got["Q"].mean() - test["Q"][:, static].mean()
    assert gain >= 0.03, (names[static], cas.names, cas.tau, gain)
    # at equal cost on valid, within a tenth of the budget on test
    assert got["T"].mean() <= 1.1 * test["T"][:, static].mean(), (got["T"].mean(), budget)


def test_the_escalation_rate_moves_with_tau(world):
    _, M, names, _, budget, Z = world
    cas = select_cascade(M, Z, names, budget, seed=0)
    z = Z[cas.cheap]["test"]
    p = cas.confidence(z)
    assert ((p >= 0) & (p <= 1)).all()
    rates = [cas.escalate(z, tau).mean() for tau in (0.0, 0.25, 0.5, 0.75, 1.0 + 1e-9)]
    assert rates[0] == 0.0 and rates[-1] == 1.0
    assert all(a <= b for a, b in zip(rates, rates[1:], strict=False))
    assert len(set(rates)) >= 3, rates  # the confidences spread over the range


def test_outcomes_pay_both_attempts_when_escalating():
    M = {"R": np.array([[0.4, 0.7], [0.9, 0.5]]), "Q": np.array([[0.5, 0.9], [1.0, 0.6]]),
         "T": np.array([[10.0, 50.0], [10.0, 50.0]])}
    got = outcomes(M, 0, 1, np.array([True, False]))
    assert got["Q"].tolist() == [0.9, 1.0]
    assert got["T"].tolist() == [60.0, 10.0]
    assert got["R"] == pytest.approx([0.7 - 0.1, 0.9])
    with pytest.raises(ConfigError, match="escalate"):
        outcomes(M, 0, 1, np.array([True]))


def test_tau_at_equal_cost_is_the_best_quality_within_the_budget():
    M = {"R": np.zeros((4, 2)), "Q": np.array([[0.0, 1.0]] * 4),
         "T": np.array([[10.0, 20.0]] * 4)}
    p = np.array([0.1, 0.2, 0.3, 0.4])
    tau, stats = choose_tau(p, M, 0, 1, budget=20.0)  # room for half the queries to escalate
    assert stats["escalated"] == 0.5 and stats["tokens"] == 20.0
    assert 0.2 < tau <= 0.3 + 1e-9
    assert choose_tau(p, M, 0, 1, budget=5.0) is None
    # abstaining (stage 2 spends nothing) on the two queries it is right for, not on all
    A = {"R": M["R"], "Q": np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),
         "T": np.array([[10.0, 0.0]] * 4)}
    tau, stats = choose_tau(p, A, 0, 1, budget=10.0)
    assert stats["escalated"] == 0.5 and stats["quality"] == 1.0


def test_cheap_candidates_keep_room_to_escalate_within_the_budget():
    M = {"Q": np.array([[0.9, 0.5, 0.6, 0.4]]), "R": np.array([[0.1, 0.4, 0.3, 0.2]]),
         "T": np.array([[100.0, 40.0, 50.0, 10.0]])}
    # the best within the budget (it can still abstain), then the best within half of it
    assert cheap_candidates(M, 60.0) == [2, 3]
    assert cheap_candidates(M, 100.0) == [0, 2, 1]
    assert cheap_candidates(M, None) == [1, 2, 3]  # without a budget: by reward


class _NoSignals:
    """Answer signals that fail when asked: a rerun must not score any answer again."""

    def score_batch(self, answers):
        raise AssertionError(f"{len(answers)} answers scored again")


def test_a_rerun_reads_the_stored_attempts_instead_of_answering_again(world, monkeypatch):
    import rag.pipeline

    prep, _, _, _, _, Z = world
    monkeypatch.setattr(rag.pipeline, "Pipeline",
                        lambda *a, **k: pytest.fail("a stored question was answered again"))
    for cheap, z in Z.items():
        again = role_features(prep, cheap, _NoSignals())
        for role in z:
            np.testing.assert_array_equal(again[role], z[role])


def test_escalation_auc_measures_how_the_confidence_separates_the_questions():
    from bench.cascade import escalation_auc

    M = {"Q": np.array([[1.0, 0.5], [1.0, 0.5], [0.0, 1.0], [0.0, 1.0]])}  # ok: 1, 1, 0, 0
    Z = np.array([[0.9, 5.0], [0.8, 1.0], [0.2, 4.0], [0.1, 2.0]])
    cas = ThresholdCascade(0, 1, ("a", "b"), Calibrator(np.zeros(2), np.ones(2), None, None),
                           0.5, {})
    cas.calibrator.predict = lambda z: z[:, 0]
    got = escalation_auc(cas, M, Z, ["sharp", "mixed"])
    assert got["ok_rate"] == 0.5 and got["confidence"] == 1.0
    assert got["best_feature"] == ["sharp", 1.0]
    # inverted: the confidence ranks every question that needs escalation first
    cas.calibrator.predict = lambda z: -z[:, 0]
    assert escalation_auc(cas, M, Z, ["sharp", "mixed"])["confidence"] == 0.0
    one_class = {"Q": np.array([[1.0, 0.5], [1.0, 0.5]])}
    assert escalation_auc(cas, one_class, Z[:2], ["sharp", "mixed"])["confidence"] is None
