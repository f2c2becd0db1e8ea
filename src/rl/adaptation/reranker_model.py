"""The cross-encoder a reranker training starts from: BERT weights + tokenizer, one logit.

No cross-encoder ships on PyPI, so training builds one: the all-MiniLM-L6-v2 BERT encoder reads
the joint "[CLS] query [SEP] passage [SEP]" input and a linear head on the pooled [CLS] state
gives one relevance logit (`BertForSequenceClassification`, num_labels=1 -- the layout
`rag.rerank.CrossEncoderReranker` loads, so a trained model is servable as is).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag.errors import ConfigError


def resolve_base(base_model: str) -> Path:
    """A local directory of BERT weights + tokenizer: a path, or a registry name."""
    p = Path(base_model).expanduser()
    if p.is_dir():
        return p
    from rag.models import default_registry

    return default_registry().get(base_model).resolve()


def load_cross_encoder(base_model: str, pooler_init: str = "pretrained"):
    """(tokenizer, BertForSequenceClassification with one logit) from bi-encoder weights; the
    classifier head is freshly initialised, the encoder reused, the [CLS] pooler reused or set
    to the identity (`pooler_init`)."""
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = resolve_base(base_model)
    if not (path / "config.json").exists():
        raise ConfigError("reranker.base_model", f"{path} has no config.json")
    tok = AutoTokenizer.from_pretrained(str(path))
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the "classifier newly initialised" report
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    finally:
        transformers.logging.set_verbosity(verbosity)
    pooler = getattr(getattr(model, "bert", None), "pooler", None)
    if pooler_init == "identity" and pooler is not None:
        with torch.no_grad():
            pooler.dense.weight.copy_(torch.eye(pooler.dense.weight.shape[0]))
            pooler.dense.bias.zero_()
    return tok, model


@dataclass
class TrainResult:
    """A trained cross-encoder (model + tokenizer) with its training record: steps, losses,
    throughput (`pairs_per_s`, `tokens_per_s`) and the training data's hash."""

    model: Any
    tokenizer: Any
    steps_done: int
    steps_total: int
    finished: bool
    losses: list[float]
    sequences: int
    tokens: int
    seconds: float
    resumed_from: int | None = None
    data_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pairs_per_s(self) -> float:
        return self.sequences / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")
