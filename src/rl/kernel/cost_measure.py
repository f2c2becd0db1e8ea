"""How each `rl.kernel.cost_model` component is measured: the real stage code on the real
(unmemoised) indexes and loaded models, timed `REPEATS` times per fixed query and size.

Component names (`CostModel.retrieval_names`, `rerank_name`, `generate_name`):
    retrieve:bm25-<backend> | retrieve:dense-<kind> | retrieve:graph@<b>+<d>:<damping>:<seeds>
    fuse:<normalisation>    rerank:<kind>:<model>    mmr:dense-<kind>    generate:<name>:<device>
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

from rag.config import RAGConfig
from rag.errors import ConfigError
from rag.fusion import fuse_scores
from rag.pipeline import Pipeline, Resources, check_question
from rag.types import Example
from rl.kernel.cost_model import QUERIES, REPEATS, Linear, median_ms

RERANK_DEPTHS = (10, 30, 50)
MMR_KS = (3, 8, 16)
GEN_KS = (1, 5, 12)
LLM_QUERIES, LLM_REPEATS = 4, 1
"""A model-backed generator costs seconds per answer: fewer, single timings."""


@contextmanager
def _uncached(gen):
    """Time real generations: a backend's generation cache would answer in microseconds."""
    saved = getattr(gen, "cache", None)
    if saved is not None:
        gen.cache = None
    try:
        yield gen
    finally:
        if saved is not None:
            gen.cache = saved


def make_measurer(indexes, resources: Resources, examples: Callable[[], Sequence[Example]],
                  base: RAGConfig) -> Callable[[str], Linear]:
    """`measure(name) -> Linear` over the first `QUERIES` of `examples()` (read on the first
    measurement) with `base`'s other fields (candidates per retriever, prompt, generation
    length)."""
    n = base.n_candidates
    _questions: list[str] = []

    def fixed_questions() -> list[str]:
        if not _questions:
            _questions.extend(check_question(e.question) for e in list(examples())[:QUERIES])
            if not _questions:
                raise ConfigError("cost_model", "no queries to measure the cost model on")
        return _questions

    def pipe(**over) -> Pipeline:
        return Pipeline(indexes, base.replace(**over), resources)

    def measure(name: str) -> Linear:
        questions = fixed_questions()
        kind, _, rest = name.partition(":")
        if kind == "retrieve":
            return Linear.fit([{}] * len(questions), [_retrieve_ms(indexes, rest, q, n)
                                                       for q in questions])
        if kind == "fuse":
            p = pipe(variant="hybrid")
            lists = [(p.indexes.bm25(base.bm25_backend).search(q, n),
                      p.indexes.dense(base.dense_index).search(q, n)) for q in questions]
            return Linear.fit([{}] * len(lists), [median_ms(
                lambda s=s, d=d: fuse_scores([s, d], [0.5, 0.5], method=rest, rrf_k=base.rrf_k,
                                             top_n=n)) for s, d in lists])
        if kind == "rerank":
            rr_kind, _, model = rest.partition(":")
            xs, ms = [], []
            for depth in RERANK_DEPTHS:
                p = pipe(variant="hybrid", rerank=rr_kind, reranker_model=model,
                         rerank_depth=depth, k=min(base.k, depth),
                         n_candidates=max(n, depth))
                p.load_models()
                for q in questions:
                    cands = p.candidates(q)
                    xs.append({"candidates": float(min(depth, len(cands)))})
                    ms.append(median_ms(lambda p=p, q=q, c=cands: p.rerank(q, c)))
            return Linear.fit(xs, ms)
        if kind == "mmr":
            xs, ms = [], []
            for k in MMR_KS:
                p = pipe(variant="hybrid", k=k, mmr_lambda=0.5, n_candidates=max(n, 4 * k))
                for q in questions:
                    cands = p.candidates(q)
                    xs.append({"pool": float(min(len(cands), 4 * k))})
                    ms.append(median_ms(lambda p=p, q=q, c=cands: p.select(q, c)))
            return Linear.fit(xs, ms)
        if kind == "generate":
            gen_name, _, device = rest.rpartition(":")
            return _generate_fit(pipe, resources, questions, gen_name, device, base)
        raise ConfigError("cost_model", f"unknown cost component {name!r}")

    return measure


def _retrieve_ms(indexes, rest: str, q: str, n: int) -> float:
    if rest.startswith("bm25-"):
        r = indexes.bm25(rest[5:])
        return median_ms(lambda: r.search(q, n))
    if rest.startswith("dense-"):
        r = indexes.dense(rest[6:])
        return median_ms(lambda: r.search(q, n))
    if rest.startswith("graph@"):
        spec, damping, seeds = rest[6:].split(":")
        b, d = spec.split("+")
        g = indexes.graph(b, d)
        return median_ms(lambda: g.search(q, n, damping=float(damping), n_seeds=int(seeds)))
    raise ConfigError("cost_model", f"unknown retriever component {rest!r}")


def _generate_fit(pipe, resources: Resources, questions: Sequence[str], gen_name: str,
                  device: str, base: RAGConfig) -> Linear:
    """ms = a + b·tokens_in + c·tokens_out from generations over 1, 5 and 12 contexts."""
    gen = resources.generator(gen_name, device)
    llm = gen_name != "extractive"
    qs, repeats = (questions[:LLM_QUERIES], LLM_REPEATS) if llm else (questions, REPEATS)
    xs, ms = [], []
    with _uncached(gen):
        for k in GEN_KS:
            p = pipe(variant="hybrid", k=k, generator=gen_name, device=device,
                     n_candidates=max(base.n_candidates, k))
            for q in qs:
                _, ctxs, _ = p.retrieve(q)
                out = {}

                def call(q=q, ctxs=ctxs, out=out):
                    out["g"] = gen.generate(q, ctxs, base.prompt_id,
                                            max_new_tokens=base.max_new_tokens,
                                            temperature=base.temperature)

                ms.append(median_ms(call, repeats))
                g = out["g"]
                xs.append({"tokens_in": float(g.tokens_in), "tokens_out": float(g.tokens_out)})
    return Linear.fit(xs, ms)
