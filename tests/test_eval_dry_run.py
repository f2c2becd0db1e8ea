"""`ragpilot eval --dry-run`: the projected judge bill, printed without running anything, and
the projection of the local scorer checked against a real scoring run."""

from __future__ import annotations

import re

import pytest

from rag.config import RAGConfig
from rag.corpus.loaders import load_dataset
from rag.metrics.cost import project_eval, project_local, stand_in_answers
from serving.cli import main


def _table(out: str, section: str) -> dict[str, list[float]]:
    """metric -> numbers of one section of the dry-run table."""
    block = out.split(section, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        parts = line.split()
        if parts and re.fullmatch(r"[a-z_]+", parts[0]):
            rows[parts[0]] = [float(x) for x in parts[1:]]
    return rows


@pytest.fixture(scope="module")
def synthetic():
    return load_dataset("synthetic")


def test_dry_run_prints_the_bill_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAGPILOT_RAGAS_BASE_URL", raising=False)
    assert main(["eval", "--dataset", "synthetic", "--split", "all", "--limit", "6",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "6 examples of synthetic" in out and "generator extractive: 0 calls" in out
    ragas = _table(out, "judge ragas")
    # calls, calls/sample, prompt tokens, completion tokens
    assert ragas["faithfulness"][:2] == [12.0, 2.0]        # statements + NLI per answer
    assert ragas["answer_relevancy"][:2] == [6.0, 1.0]     # identical prompts answered once
    assert ragas["context_precision"][:2] == [30.0, 5.0]   # one verdict per context, k=5
    assert ragas["context_recall"][:2] == [6.0, 1.0]
    assert ragas["total"][0] == 54.0
    assert all(r[2] > 100 * r[0] for r in ragas.values())  # prompts carry the contexts
    local = _table(out, "judge local")
    assert local["faithfulness"][1] > 6 and local["answer_relevancy"][1] >= 6
    assert local["context_precision"] == [0.0, 0.0, 0.0]  # gold ids: id-based, no encoding
    assert local["total"][0] <= sum(r[0] for m, r in local.items() if m != "total")
    assert list(tmp_path.iterdir()) == []  # nothing retrieved, generated or written

    assert main(["eval", "--dataset", "synthetic", "--split", "all", "--limit", "6",
                 "--set", "k=3", "--set", "generator=smollm2-135m-instruct",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _table(out, "judge ragas")["context_precision"][:2] == [18.0, 3.0]
    gen = re.search(r"generator smollm2-135m-instruct: (\d+) calls, (\d+) prompt tokens, "
                    r"<= (\d+) completion", out)
    assert gen and int(gen[1]) == 6 and int(gen[2]) > 6 * 30 and int(gen[3]) == 6 * 48


@pytest.mark.parametrize(("argv", "needle"), [
    (["--limit", "0", "--dry-run"], "--limit"),
    (["--set", "k=0", "--dry-run"], "rag.k"),
    (["--set", "kk=1", "--dry-run"], "rag.kk: unknown key"),
    ([], "--out: required unless --dry-run"),
])
def test_bad_arguments_exit_2_naming_the_field(argv, needle, capsys):
    assert main(["eval", "--dataset", "synthetic", "--split", "all", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_bad_split_exits_2(capsys):
    assert main(["eval", "--dataset", "synthetic", "--split", "test", "--dry-run"]) == 2
    assert "split manifest" in capsys.readouterr().err


def test_local_projection_equals_a_real_run(synthetic):
    """The projection (tokenizer only) books exactly the encoder work the scorer then does."""
    from rag.metrics.quality import METRICS, QualityScorer

    examples = list(synthetic.examples[:8])
    answers = stand_in_answers(examples, synthetic.corpus, k=4)
    # without gold ids the context metrics need the support score too: both paths covered
    no_gold = [e.__class__(e.id, e.question, e.answers) for e in examples[4:]]
    exs = examples[:4] + no_gold
    proj = project_local(answers, exs)
    scorer = QualityScorer()
    rows = scorer.score_batch(answers, exs)
    # the support-based context path was taken (a yes/no reference has no claim to check)
    assert all(("context_recall" in r) == (e.answers[0] not in ("yes", "no"))
               for r, e in zip(rows[4:], no_gold, strict=True))
    assert sum("context_recall" in r for r in rows[4:]) >= 2
    u = scorer.usage
    for m in METRICS:
        assert proj[m]["texts"] == u[m]["texts"]
        assert proj[m]["tokens"] == u[m]["tokens"]
        assert proj[m]["forward_passes"] == u[m]["encoder_calls"]
    assert proj["total"]["forward_passes"] <= u["total"]["encoder_calls"]
    assert proj["total"]["texts"] == u["total"]["texts"] > 8


def test_projection_is_deterministic(synthetic):
    cfg = RAGConfig()
    ex = list(synthetic.examples[:5])
    a = project_eval(cfg, ex, synthetic.corpus, local=False)
    b = project_eval(cfg, ex, synthetic.corpus, local=False)
    assert a == b and a["ragas"]["total"]["calls"] == 5 * 9
