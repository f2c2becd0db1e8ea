"""The fixed portfolio of configs a per-query router chooses among ("arms"): the static
default plus 29 configs spread over retriever, k, fusion weight and normalisation, MMR, cosine
rerank and the two prompts, each made from the policy's base config (`rl.kernel.settings.TunerSettings`).

    portfolio(settings) -> [(name, RAGConfig), ...]     # arm 0 is the static default
    with_formulations(arms, ("last_two_user", "all_user"))   # + each arm per formulation

On conversational data a router also chooses how the turn's retrieval query is formed:
`with_formulations` adds each non-abstaining arm again with every other query formulation
(`<name>@<formulation>`; 31 -> 85 arms with the search's best-known config left out). It
pays only with the formulation views in the features (`rl.routing.features.conversation_views`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rag.config import RAGConfig

PORTFOLIO: tuple[tuple[str, dict[str, Any]], ...] = (
    ("static-default", {}),
    ("bm25-k3", {"variant": "bm25", "k": 3}),
    ("bm25-k8", {"variant": "bm25", "k": 8}),
    ("bm25-k16-rerank", {"variant": "bm25", "k": 16, "rerank": "cosine"}),
    ("dense-k1", {"variant": "dense", "k": 1}),
    ("dense-k3", {"variant": "dense", "k": 3}),
    ("dense-k5-mmr0.7", {"variant": "dense", "k": 5, "mmr_lambda": 0.7}),
    ("dense-k12", {"variant": "dense", "k": 12}),
    ("dense-k32", {"variant": "dense", "k": 32}),
    ("hybrid-k1", {"k": 1}),
    ("hybrid-k2-w0.9-zscore", {"k": 2, "fusion_weight": 0.9, "normalisation": "zscore"}),
    ("hybrid-k3-w0.3", {"k": 3, "fusion_weight": 0.3}),
    ("hybrid-k3-w0.7", {"k": 3, "fusion_weight": 0.7}),
    ("hybrid-k5-zscore", {"normalisation": "zscore"}),
    ("hybrid-k5-rrf", {"normalisation": "rrf"}),
    ("hybrid-k5-mmr0.5", {"mmr_lambda": 0.5}),
    ("hybrid-k8-w0.8", {"k": 8, "fusion_weight": 0.8}),
    ("hybrid-k8-rerank", {"k": 8, "rerank": "cosine"}),
    ("hybrid-k8-mmr0.8-rerank", {"k": 8, "mmr_lambda": 0.8, "rerank": "cosine"}),
    ("hybrid-k12-w0.3-zscore", {"k": 12, "fusion_weight": 0.3, "normalisation": "zscore"}),
    ("hybrid-k16-rrf", {"k": 16, "normalisation": "rrf"}),
    ("hybrid-k24", {"k": 24}),
    ("hybrid-k32-w0.2", {"k": 32, "fusion_weight": 0.2}),
    ("hybrid-k3-abstain", {"k": 3, "prompt_id": "cite_concise_abstain"}),
    ("hybrid-k5-abstain", {"prompt_id": "cite_concise_abstain"}),
    ("hybrid-k12-rerank-abstain", {"k": 12, "rerank": "cosine",
                                   "prompt_id": "cite_concise_abstain"}),
    ("graph-k3", {"variant": "graph", "k": 3}),
    ("graph-k5", {"variant": "graph", "k": 5}),
    ("graph-k8-rerank", {"variant": "graph", "k": 8, "rerank": "cosine"}),
    ("graph-k16", {"variant": "graph", "k": 16}),
)
"""(name, RAGConfig overrides of the policy's base config); the first is the static default."""


def portfolio(policy: Any) -> list[tuple[str, RAGConfig]]:
    """The portfolio as RAGConfigs from `policy.base_config()`; a rerank depth below k is
    raised to k (the config requires rerank_depth >= k)."""
    base = policy.base_config()
    out = []
    for name, over in PORTFOLIO:
        if over.get("rerank", "none") != "none":
            over = {**over, "rerank_depth": max(base.rerank_depth, over.get("k", base.k))}
        out.append((name, base.replace(**over)))
    return out


def with_formulations(arms: list[tuple[str, RAGConfig]], formulations: Sequence[str],
                      skip: Collection[str] = ()) -> list[tuple[str, RAGConfig]]:
    """`arms` followed by each arm again with every formulation in `formulations` other than
    its own (`<name>@<formulation>`), leaving out abstaining prompts, the arms named in `skip`
    and configs already present. () gives `arms` unchanged."""
    seen = {c.config_hash for _, c in arms}
    extra = []
    for name, cfg in arms:
        if "abstain" in cfg.prompt_id or name in skip:
            continue
        for f in formulations:
            if (cfg.query_formulation or "last_turn") == f:
                continue
            new = cfg.replace(query_formulation=None if f == "last_turn" else f)
            if new.config_hash not in seen:
                seen.add(new.config_hash)
                extra.append((f"{name}@{f}", new))
    return list(arms) + extra
