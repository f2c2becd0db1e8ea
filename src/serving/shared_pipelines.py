"""`SharedPipelines`: one Ray Serve deployment that answers for every config variant.

Each replica opens the served dataset's IndexSet once (BM25/tantivy, FAISS, graph, the query
encoder) and loads each reranker/generator once (`rag.pipeline.Resources`); a variant is only
a `RAGConfig` sent with the request, for which the replica keeps a light `Pipeline` view
(`Pipeline.with_config`: same indexes, same loaded models) in an LRU of `max_variants`. So an
extra variant costs a few objects, not a process with its own indexes and models (the
per-config `Pipeline_<hash>` deployments of serving.pipelines did: up to 16 copies).

Why one shared deployment rather than the alternatives:
  * a retrieval deployment + light per-config stage deployments: every request would make
    two replica hops and ship the candidate lists between them, and the stages after
    retrieval (rerank, generation) need the same loaded models, so they would either load
    them again or call back; nothing is saved over this;
  * Serve model multiplexing keyed by config hash: multiplexing pays off when a "model" is
    expensive to load and replicas can hold only a few, so requests should go where it is
    loaded; here the per-config state is cheap (built in microseconds from the shared
    IndexSet), so affinity would only unbalance load across replicas and add a cold-load
    path. Any replica answers any variant, and Serve's power-of-two router balances them.
Autoscaling (`pipelines.autoscaling`: min/max replicas, target ongoing requests) applies to
this one deployment; each new replica adds one copy of the indexes for all variants at once.

`VariantHandle` makes the shared deployment look like the per-variant handles the ingress
routes to (`await h.answer.remote(question, iid)`, `await h.info.remote()`,
`await h.signals.remote(payload)`), so routing, the shadow path and the health check are
unchanged.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from ray import serve

from rag.config import RAGConfig
from rag.env import configure_runtime_env
from serving.pipelines import answer_record, open_served_data, score_signals, warm_up


class SharedPipelineService:
    """The replica body (usable without Ray): one IndexSet and model cache for all variants.
    `answer(variant_id, config, question, query_id)` answers with `config` (RAGConfig JSON
    whose hash is `variant_id`; a mismatch is refused); `warmup`: configs answered once at
    start (models loaded before the replica reports ready)."""

    def __init__(self, dataset: str | None = None, index_dir: str | None = None,
                 indexes: dict[str, Any] | None = None, max_variants: int = 8,
                 warmup: list[dict[str, Any]] | None = None):
        configure_runtime_env()
        from rag.pipeline import Pipeline

        served, self.gold = open_served_data(dataset, index_dir, indexes)
        self._root = Pipeline(served)  # its Resources: the models every variant shares
        self.max_variants = max_variants
        self._views: OrderedDict[str, tuple[dict[str, Any], Any]] = OrderedDict()
        self._lock = threading.Lock()
        for cfg in warmup or ():
            c = RAGConfig.from_dict(cfg)
            warm_up(self.pipeline_for(c.config_hash, cfg))

    def pipeline_for(self, variant_id: str, config: dict[str, Any]):
        """The Pipeline view of one variant (built once, least recently used dropped past
        `max_variants`: dropping only frees the small view, never shared indexes/models)."""
        with self._lock:
            hit = self._views.get(variant_id)
            if hit is not None and hit[0] == config:  # same id, same config: no re-hashing
                self._views.move_to_end(variant_id)
                return hit[1]
        cfg = RAGConfig.from_dict(config, where=f"variant.{variant_id}")
        if cfg.config_hash != variant_id:
            from rag.errors import ConfigError

            raise ConfigError("variant_id", f"config hashes to {cfg.config_hash}, not "
                                            f"{variant_id}")
        view = self._root.with_config(cfg)
        with self._lock:
            self._views[variant_id] = (dict(config), view)
            while len(self._views) > self.max_variants:
                self._views.popitem(last=False)
        return view

    def answer(self, variant_id: str, config: dict[str, Any], question: str,
               query_id: str = "q", history=None) -> dict[str, Any]:
        """Answer one question with one variant (same record as PipelineService.answer)."""
        return answer_record(self.pipeline_for(variant_id, config), self.gold, question,
                             query_id, history)

    def signals(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The reference-free signals of any variant's answer (`serving.pipelines.
        score_signals` of its record's `signal_input`): what the ingress asks for after the
        reply is sent."""
        return score_signals(payload)

    def info(self, variant_id: str | None = None,
             config: dict[str, Any] | None = None) -> dict[str, Any]:
        """This replica: pid, loaded variant views; with a variant, also checks its config
        builds (the health probe of that variant)."""
        if variant_id is not None and config is not None:
            self.pipeline_for(variant_id, config)
        with self._lock:
            loaded = list(self._views)
        return {"variant_id": variant_id, "config": config, "pid": os.getpid(),
                "gold_questions": len(self.gold), "variants_loaded": loaded}


@serve.deployment(name="SharedPipelines")
class SharedPipelines(SharedPipelineService):
    """Serve deployment answering for every variant (`SharedPipelineService`)."""


def bind_shared(dataset: str | None, index_dir: str | None, options: dict[str, Any],
                indexes: dict[str, Any] | None, max_variants: int,
                warmup: list[dict[str, Any]]):
    """The bound shared deployment (`options`: serving.pipelines.deployment_options, so
    `pipelines.autoscaling` / `num_replicas` apply to it)."""
    return SharedPipelines.options(**options).bind(dataset, index_dir, indexes, max_variants,
                                                   warmup)


class _Bound:
    """`.remote(*args)` of one method of the shared handle, with the variant prepended."""

    def __init__(self, method: Any, variant_id: str, config: dict[str, Any]):
        self.method, self.variant_id, self.config = method, variant_id, config

    def remote(self, *args: Any):
        return self.method.remote(self.variant_id, self.config, *args)


class VariantHandle:
    """A per-variant view of the shared deployment's handle: `answer.remote(question, iid)`,
    `info.remote()` and `signals.remote(payload)` as the ingress calls them on any variant
    handle (the signals need no variant)."""

    def __init__(self, shared: Any, variant_id: str, config: dict[str, Any]):
        self.variant_id = variant_id
        self.answer = _Bound(shared.answer, variant_id, config)
        self.info = _Bound(shared.info, variant_id, config)
        self.signals = shared.signals
