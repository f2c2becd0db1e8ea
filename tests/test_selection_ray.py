"""Selection training as Ray tasks (rl.selection.runner) gives the same numbers as the in-process
path for a fixed seed: the main comparison (BC -> RAFT -> PPO, PPO inside a Ray task joining the
running runtime) and the ablation grid, on hand-built pools (real build_pool / reader)."""

from __future__ import annotations

import numpy as np
import pytest

from rag.corpus import Corpus
from rag.types import Example, Hit, Passage
from rl.selection.ablate import Sizes, run_dataset
from rl.selection.config import SelectionConfig
from rl.selection.features import build_pool
from rl.selection.runner import LocalRunner, RayRunner

pytestmark = pytest.mark.ray

SPLITS = {"train": 12, "valid": 6, "test": 6}


def _pool(q: int, split: str, cfg: SelectionConfig):
    """A bridge question: gold 1 names gold 2's title, gold 2 holds the year; near-duplicates
    of gold 1 and distractors around them (seeded per query)."""
    rng = np.random.default_rng([q, len(split)])
    person, town, year = f"Zorvath{split}{q}", f"Quillby{split}{q}", 1900 + q
    qid = f"{split}-{q}"
    ps = [Passage(f"{qid}-g1", f"{person} was a painter born in {town}.", person),
          Passage(f"{qid}-g2", f"{town} was founded in {year} by settlers.", town),
          Passage(f"{qid}-d1", f"{person} was a painter born in {town} long ago.", person)] + \
        [Passage(f"{qid}-x{i}", f"Unrelated text {i} about rivers and {1800 + i}.", f"River {i}")
         for i in range(cfg.env.k)]
    ex = Example(qid, f"When was the birthplace of {person} founded?", (str(year),),
                 (f"{qid}-g1", f"{qid}-g2"))
    order = [p.id for p in ps]
    order = order[:1] + order[2:6] + order[1:2] + order[6:]
    hits = [Hit(1.0 - i / len(order), pid) for i, pid in enumerate(order)]
    base = rng.normal(size=8)
    vec = {p.id: (base + 0.1 * rng.normal(size=8)) if p.id.endswith(("-g1", "-d1"))
           else rng.normal(size=8) for p in ps}
    vec = {k: v / np.linalg.norm(v) for k, v in vec.items()}
    qv = base + 0.5 * rng.normal(size=8)
    lists = {"bm25": hits, "dense": hits, "graph": hits[::-1], "hybrid": hits}
    return build_pool(ex, ex.question, lists, Corpus(ps), qv / np.linalg.norm(qv),
                      lambda ids: np.stack([vec[i] for i in ids]), cfg.env.k, "hybrid",
                      cfg.env.reranker)


class TinyData:
    """SelectionData's interface (pools / build_ms) over hand-built pools: the pools honour the
    config's K and reranker, so ablation arms with their own pools differ for real."""

    def __init__(self, cfg: SelectionConfig):
        self.cfg = cfg
        self.build_ms = [1.0]

    def pools(self, split: str, limit: int | None = None, cfg: SelectionConfig | None = None):
        return [_pool(q, split, cfg or self.cfg) for q in range(limit or SPLITS[split])]


@pytest.fixture(scope="module")
def ray_session():
    """The session's Ray runtime: joined when an earlier module started it, else started the
    project's way (rl.common.runtime.init_ray); left up for later modules (one runtime per session)."""
    from rl.common.runtime import init_ray

    init_ray()


@pytest.fixture(scope="module")
def cfg():
    return SelectionConfig.load().replace(**{
        "bc.epochs": 8, "bc.patience": 3, "raft.rounds": 1, "raft.samples": 2,
        "raft.epochs": 2, "ppo.train_batch_size": 16, "ppo.minibatch_size": 8,
        "ppo.num_epochs": 1, "env.reranker_model": "no-such-cross-encoder"})


def _numbers(rows):
    """Every row but the wall-clock selection latency."""
    return [r for r in rows if r["metric"] != "selection_ms_p50"]


def test_ray_tasks_match_in_process(ray_session, cfg):
    sizes = Sizes(train=12, valid=6, test=6, ks=(20,), lambdas=(0.2,), ppo_iterations=1,
                  faithfulness=False)
    local_rows, local_info = run_dataset("tiny", cfg, sizes, log=lambda m: None,
                                         runner=LocalRunner(), data=TinyData(cfg))
    runner = RayRunner(parallel=2)
    ray_rows, ray_info = run_dataset("tiny", cfg, sizes, log=lambda m: None, runner=runner,
                                     data=TinyData(cfg))
    assert ray_info["runner"].startswith("ray tasks") and not runner.started
    assert local_info["runner"].startswith("in-process")
    # the whole stack and grid ran: PPO (inside a Ray task) and every arm but the cross-encoder
    systems = {r["system"] for r in ray_rows}
    assert {"bc", "bc_raft", "bc_raft_ppo", "bc_raft_ppo - rerank",
            "ablation:mmr_lambda=0.2 mmr", "ablation:shaping=final_only bc_raft",
            "ablation:reranker=none bc_raft", "ablation:k=20 bc_raft"} <= systems
    assert ray_info["ablation_notes"]["reranker=cross_encoder"].startswith("not run")
    assert ray_info["training"]["ppo"]["iterations"] == 1
    # same seeds per stage and arm: identical numbers, CIs and order
    assert _numbers(ray_rows) == _numbers(local_rows)
    for stage in ("bc", "raft"):
        strip = {"seconds"}
        assert {k: v for k, v in ray_info["training"][stage].items() if k not in strip} == \
            {k: v for k, v in local_info["training"][stage].items() if k not in strip}
    assert [c["episode_return_mean"] for c in ray_info["training"]["ppo"]["curve"]] == \
        [c["episode_return_mean"] for c in local_info["training"]["ppo"]["curve"]]


def test_throttle_keeps_at_most_parallel_in_flight(ray_session):
    runner = RayRunner(parallel=1)
    refs = [runner.submit(sum, [i, 1]) for i in range(3)]
    assert len(runner._in_flight) == 1
    assert [runner.get(r) for r in refs] == [1, 2, 3]
