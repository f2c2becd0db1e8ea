"""`rl.tuner.searchers.LocalSearch` (method `local-asha`) as a Tune searcher: the start point
first, then one-head moves of the parent (the best trial at the highest rung), the pattern move
after an improvement, no point twice, seeded determinism."""

from ray import tune

from rl.tuner.searchers import LocalSearch

SPACE = {"k": tune.randint(1, 33), "w": tune.quniform(0.0, 1.0, 0.05),
         "variant": tune.choice(["bm25", "dense", "hybrid"])}
START = {"k": 5, "w": 0.5, "variant": "hybrid"}


def _searcher(seed=0, **kw):
    s = LocalSearch(metric="score", mode="max", seed=seed, points_to_evaluate=[START], **kw)
    assert s.set_search_properties("score", "max", SPACE)
    return s


def _diff(a, b):
    return {h for h in a if a[h] != b[h]}


def test_start_first_then_one_head_moves_of_the_parent():
    s = _searcher(explore=0.0)
    assert s.suggest("t0") == START
    s.on_trial_complete("t0", {"score": 0.5, "training_iteration": 3})
    seen = [START]
    for i in range(1, 10):  # the start's neighbourhood: 2 + 2 + 2 moves, then two-head moves
        p = s.suggest(f"t{i}")
        assert p not in seen
        seen.append(p)
        assert 1 <= p["k"] <= 32 and 0.0 <= p["w"] <= 1.0 and p["variant"] in SPACE["variant"]
        s.on_trial_complete(f"t{i}", {"score": 0.1, "training_iteration": 1})  # cut at rung 1
        assert len(_diff(p, START)) == (1 if i <= 6 else 2)


def test_the_parent_is_the_best_at_the_highest_rung():
    s = _searcher(explore=0.0)
    s.suggest("a")
    s.on_trial_complete("a", {"score": 0.5, "training_iteration": 3})
    s.suggest("b")
    s.on_trial_complete("b", {"score": 0.9, "training_iteration": 1})  # better, but a low rung
    assert s.parent() == "a"
    p = s.suggest("c")
    s.on_trial_result("c", {"score": 0.7, "training_iteration": 1})
    s.on_trial_complete("c", {"score": 0.6, "training_iteration": 3})
    assert s.parent() == "c"
    assert len(_diff(s.suggest("d"), p)) == 1  # the new parent's neighbourhood


def test_the_parent_is_feasible_first_then_least_violating():
    """At one rung: a feasible trial beats any infeasible one whatever the scores; among
    infeasible ones the smaller total violation wins (the score only breaks ties)."""
    s = _searcher(explore=0.0)
    for t in "abcd":
        s.suggest(t)

    def tell(t, score, **violations):
        s.on_trial_complete(t, {"score": score, "training_iteration": 3,
                                **{f"violation_{g}": v for g, v in violations.items()}})

    tell("a", -0.4, relevancy=0.08)  # cheap, 8% short of the relevancy gate
    tell("b", -0.6, relevancy=0.02, faithfulness=-0.3)  # dearer, 2% short: closer to feasible
    assert s.parent() == "b"
    tell("c", -0.6, relevancy=0.01, p95_latency_ms=0.01)  # 1% + 1%: ties b, scores no better
    assert s.parent() == "b"
    tell("d", 0.2, relevancy=-0.01, faithfulness=-0.2, p95_latency_ms=-0.5)  # feasible
    assert s.parent() == "d"
    s.suggest("e")
    tell("e", 0.9, relevancy=0.001)  # the best score, but infeasible
    assert s.parent() == "d"


def test_an_improving_ordered_move_is_tried_again_in_the_same_direction():
    s = _searcher(explore=0.0)
    s.suggest("a")
    s.on_trial_complete("a", {"score": 0.5, "training_iteration": 3})
    for i in range(6):
        p = s.suggest(f"m{i}")
        if _diff(p, START) == {"k"} and p["k"] < START["k"]:
            break
        s.on_trial_complete(f"m{i}", {"score": 0.0, "training_iteration": 1})
    else:
        raise AssertionError("no k-down move in the start's neighbourhood")
    s.on_trial_complete(f"m{i}", {"score": 0.8, "training_iteration": 3})
    nxt = s.suggest("next")
    assert _diff(nxt, p) == {"k"} and nxt["k"] < p["k"]  # k down again (p["k"] >= 2 here)


def test_same_seed_same_suggestions():
    def run(seed):
        s, out = _searcher(seed), []
        for i in range(12):
            out.append(s.suggest(str(i)))
            s.on_trial_complete(str(i), {"score": float(-abs(out[-1]["k"] - 2)),
                                         "training_iteration": 1 + i % 3})
        return out

    assert run(3) == run(3) and run(3) != run(4)


def test_no_point_twice_on_a_tiny_space_until_it_is_spent():
    space = {"variant": tune.choice(["bm25", "dense", "hybrid"])}
    s = LocalSearch(metric="score", mode="max", seed=0)
    s.set_search_properties("score", "max", space)
    got = []
    for i in range(3):
        got.append(s.suggest(str(i))["variant"])
        s.on_trial_complete(str(i), {"score": float(i), "training_iteration": 1})
    assert sorted(got) == ["bm25", "dense", "hybrid"]
