"""bench/gate_spike.py's neighbourhood: every config one head away in the tuner's space, each
once, none equal to the centre (no data, no evaluation)."""

from __future__ import annotations

from bench.gate_spike import neighbours

from rag.config import RAGConfig
from rl.kernel.settings import TunerSettings
from rl.kernel.space import ConfigSpace


def test_one_head_neighbours_differ_in_one_head_and_repeat_nothing():
    space = ConfigSpace(TunerSettings.defaults(), conversational=True)
    centre = RAGConfig(variant="hybrid", k=6, fusion_weight=0.15)
    got = neighbours(space, centre)
    hashes = [c.config_hash for _, c in got]
    assert len(hashes) == len(set(hashes)) and centre.config_hash not in hashes
    p0 = space.to_params(centre)  # the heads that act in the centre
    heads = set()
    for label, cfg in got:
        head = label.split("=")[0]
        p = space.to_params(cfg)
        # among heads acting in both, only the moved one differs (variant=bm25 also stops
        # the fusion weight acting: that is one move)
        assert {h for h in p0.keys() & p.keys() if p[h] != p0[h]} <= {head}, label
        heads.add(head)
    assert {"k", "fusion_weight", "variant", "query_formulation"} <= heads
    ks = sorted(space.to_params(c, complete=True)["k"] for lb, c in got if lb.startswith("k="))
    assert ks == [4, 5, 7, 8]  # two choices either way
