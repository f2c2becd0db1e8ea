"""The Python API's one-call evaluation (`rl.kernel.evaluator.evaluate`, `rag.evaluate.evaluate`)
names the argument it cannot use (a ConfigError, as the CLI's exit 2) instead of a TypeError
from deep inside, an empty split name read as "the default", or a batch quietly cut to the
split's size (the stop-56 audit)."""

from __future__ import annotations

import pytest

from rag.config import RAGConfig
from rag.errors import ConfigError


@pytest.mark.parametrize("kwargs, field", [
    ({"config": "configs/rag/default.yaml"}, "config"),   # a path is not a config
    ({"dataset": 5}, "dataset"),
    ({"dataset": ""}, "dataset"),
    ({"split": ""}, "split"),                               # was: the tuning split
    ({"split": 1}, "split"),
    ({"settings": {"reward": {}}}, "settings"),
    ({"batch_size": "10"}, "batch_size"),
    ({"batch_size": True}, "batch_size"),
    ({"seed": -1}, "seed"),
    ({"seed": 1.5}, "seed"),
])
def test_tuner_evaluate_names_the_argument_it_cannot_use(kwargs, field):
    from rl.kernel.evaluator import evaluate

    args = {"config": RAGConfig(), "dataset": "synthetic", **kwargs}
    with pytest.raises(ConfigError) as exc:
        evaluate(**args)
    assert exc.value.field == field


def test_a_batch_larger_than_the_split_is_refused_not_cut():
    from rl.kernel.evaluator import evaluate

    with pytest.raises(ConfigError, match=r"must be 1\.\.120 \(split test has 120") as exc:
        evaluate(RAGConfig(k=3), "synthetic", split="test", batch_size=121)
    assert exc.value.field == "batch_size"
    with pytest.raises(ConfigError, match=r"must be 1\.\.120") as exc:
        evaluate(RAGConfig(k=3), "synthetic", split="test", batch_size=0)
    assert evaluate(RAGConfig(k=3), "synthetic", split="test", batch_size=5).n == 5


def test_pipeline_evaluate_checks_what_it_is_given():
    from rag.evaluate import evaluate
    from rag.types import Example

    ex = [Example(id="q1", question="Who?", answers=("A",))]
    with pytest.raises(ConfigError) as exc:
        evaluate(object(), ex)
    assert exc.value.field == "pipeline"
    with pytest.raises(ConfigError) as exc:
        evaluate(object(), ["Who?"])
    assert exc.value.field == "examples"
