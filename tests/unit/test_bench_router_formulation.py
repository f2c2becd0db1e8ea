"""bench/router_formulation.py without data: the formulation arms it adds, and its rows (one
reference scale for every variant)."""

from __future__ import annotations

import numpy as np
from bench.router_formulation import formulation_arms, markdown, rows_of

from rag.config import RAGConfig


def test_formulation_arms_add_each_other_formulation_once_and_skip_abstain_and_search():
    base = [("static-default", RAGConfig()),
            ("hybrid-k3-abstain", RAGConfig(k=3, prompt_id="cite_concise_abstain")),
            ("graph-k3", RAGConfig(variant="graph", k=3)),
            ("search-best-known", RAGConfig(k=6, query_formulation="last_two_user"))]
    got = formulation_arms(base)
    assert got[:4] == base
    extra = {n: c for n, c in got[4:]}
    assert sorted(extra) == ["graph-k3@all_user", "graph-k3@last_two_user",
                             "static-default@all_user", "static-default@last_two_user"]
    assert extra["graph-k3@all_user"].query_formulation == "all_user"
    assert extra["graph-k3@all_user"].replace(query_formulation=None) == base[2][1]
    hashes = [c.config_hash for _, c in got]
    assert len(hashes) == len(set(hashes))


def test_rows_are_on_the_base_reference_and_the_stronger_static_one():
    ref = np.array([0.5, 0.4, 0.6, 0.5])
    got = {"ref": ref, "ref-ext": ref + 0.01, "router": ref + 0.03, "oracle": ref + 0.2,
           "oracle-ext": ref + 0.25}
    folds = [{"margin": 0.0, "switched": 0.5, "other_formulation": 0.25,
              "best_static": "graph-k3", "best_static_ext": "graph-k3@last_two_user"}]
    done = {"router": {"got": got, "folds": folds, "arms": 31, "features": 42, "n": 4,
                       "wall_s": 1.0}}
    rows = rows_of(done, seed=0)
    by = {r["system"]: r for r in rows}
    assert abs(by["router"]["value"] - 0.03) < 1e-12
    assert abs(by["router - best-static+formulation-arms"]["value"] - 0.02) < 1e-12
    assert abs(by["best-static+formulation-arms"]["value"] - 0.01) < 1e-12
    assert abs(by["per-query-oracle+formulation-arms"]["value"] - 0.25) < 1e-12
    assert all(r["dataset"] == "mtrag" and r["metric"] == "delta_reward" and r["n"] == 4
               for r in rows)
    md = markdown({"quick": True, "details": {"router": done["router"]}}, rows)
    assert "| router | 31 | 42 | +0.0300" in md and "graph-k3@last_two_user" in md
