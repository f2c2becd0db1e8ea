"""Offline replay of the interaction log through a candidate config (rl.promotion.replay, `ragpilot
rollout replay`): a log written in the export format from real pipeline answers on the
synthetic world, replayed through a clearly better and a clearly worse candidate; bad input."""

from __future__ import annotations

import json
import uuid

import pytest

from rag.config import RAGConfig
from rag.corpus.hygiene import gold_by_question
from rag.errors import ConfigError, DataError
from rl.kernel.settings import Thresholds
from rl.promotion.replay import ReplayEvaluator, read_log, stable_rows
from rl.promotion.state_machine import PromotionSettings, PromotionStateMachine
from serving.cli import main as cli_main

N = 30  # questions in the log (bm25 + extractive: ~0.1 s per replay after the scorer loads)
# the abstaining prompt answers INSUFFICIENT to ~a third of the questions: no faithfulness, zero
# relevancy (and a lower gold F1) on those, at the same retrieval, tokens and latency
TERSE = RAGConfig(variant="bm25", k=5)
ABSTAIN = RAGConfig(variant="bm25", k=5, prompt_id="cite_concise_abstain")
WORSE = RAGConfig(variant="bm25", k=1, prompt_id="cite_concise_abstain")
RELAXED = Thresholds(faithfulness=0.5, relevancy=0.2, p95_latency_ms=500)
"""Gates on the RAGAS scale of terse extractive answers (answer relevancy ~0.3-0.4)."""


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    from rag.indexset import IndexSet
    from rag.pipeline import Resources

    idx = IndexSet.create(world.corpus, tmp_path_factory.mktemp("replay-index"),
                          show_progress=False)
    gold = gold_by_question(world.examples)
    return idx, Resources(), gold


@pytest.fixture(scope="module")
def scorer():
    from rag.metrics.quality import QualityScorer

    return QualityScorer(metrics=("faithfulness", "answer_relevancy"))


def export_log(served, world, cfg: RAGConfig, path, n: int = N):
    """`InteractionStore.export_jsonl` of `n` requests served by `cfg` (rows as the ingress
    logs them: stage ms + `pipeline`), plus rows the replay must skip: a shadow answer of
    another config, a failed request and a canary row."""
    from rag.pipeline import Pipeline
    from serving.store import Interaction, SQLiteStore

    idx, res, _ = served
    store = SQLiteStore(path.with_suffix(".sqlite"), synchronous="OFF")
    pipe = Pipeline(idx, cfg, res)
    ts = 1_700_000_000.0
    for j, e in enumerate(world.examples[:n]):
        a = pipe.run(e.question, e.id)
        iid = uuid.uuid4().hex
        store.log_interaction(Interaction(
            id=iid, question=e.question, variant_id=cfg.config_hash, route="stable",
            propensity=1.0, answer=a.text, ts=ts + j, context_ids=list(a.context_ids),
            citations=list(a.citations),
            latency_ms={**a.latency_ms, "pipeline": a.total_latency_ms + 2.0},
            tokens_in=a.tokens_in, tokens_out=a.tokens_out, scores={"f1": 0.0}))
        if j == 0:
            store.log_interaction(Interaction(
                id=uuid.uuid4().hex, question=e.question, variant_id="shadowcfg", route="shadow",
                propensity=1.0, answer="x", ts=ts + j, shadow=True, parent_id=iid))
    store.log_interaction(Interaction(
        id=uuid.uuid4().hex, question="q?", variant_id=cfg.config_hash, route="stable",
        propensity=1.0, answer="", ts=ts + n, latency_ms={"pipeline": 3.0}, error=True))
    store.log_interaction(Interaction(
        id=uuid.uuid4().hex, question="q?", variant_id="othercfg", route="canary",
        propensity=0.05, answer="a", ts=ts + n + 1, latency_ms={"pipeline": 3.0}))
    store.export_jsonl(path)
    store.close()
    return path


def test_cli_replay_better_candidate_is_promoted_to_shadow(served, world, tmp_path, capsys):
    idx = served[0]
    log = export_log(served, world, ABSTAIN, tmp_path / "log.jsonl")
    cand = tmp_path / "candidate.yaml"
    cand.write_text(TERSE.to_yaml())
    policy = tmp_path / "rollout.yaml"
    policy.write_text(json.dumps({"rollout": {"thresholds": RELAXED.model_dump()}}))
    d = str(tmp_path / "rollout")
    assert cli_main(["rollout", "start", "--state-dir", d, "--candidate", str(cand),
                     "--stable", ABSTAIN.config_hash, "--config", str(policy),
                     "--store", str(tmp_path / "log.sqlite")]) == 0  # the server's store
    capsys.readouterr()
    # --stable, gates and SLO come from the active rollout
    assert cli_main(["rollout", "replay", "--state-dir", d, "--log", str(log),
                             "--index", str(idx.root), "--candidate", str(cand),
                             "--dataset", "synthetic"]) == 0
    out, err = capsys.readouterr()
    rep = json.loads(out)
    assert rep["kind"] == "offline" and rep["paired"] and rep["ci_method"] == "bootstrap"
    assert rep["meta"]["estimator"] == "replay" and rep["meta"]["rows"] == N
    assert rep["meta"]["skipped_rows"] == 3  # shadow, failed, other variant
    assert rep["meta"]["candidate_hash"] == TERSE.config_hash
    assert rep["diff"] > 0.05 and rep["ci_low"] > 0
    assert rep["candidate"]["relevancy"] > rep["stable"]["relevancy"]
    assert rep["meta"]["gold"]["n"] == N and rep["meta"]["gold"]["f1_diff"] > 0
    assert rep["gates_passed"] and rep["candidate"]["errors"] == 0
    assert "next: ragpilot rollout advance" in err
    # each metric judged as the candidate stage will judge it, and that stage's decision
    assert "candidate stage: pass" in err and "  quality: " in err and "  tokens: " in err
    report = tmp_path / "rollout" / "replay_report.json"
    assert json.loads(report.read_text())["diff"] == rep["diff"]
    assert "mirrored" not in err and rep["metrics"]["quality"]["paired"]  # per-metric stats
    assert cli_main(["rollout", "advance", "--state-dir", d, "--evidence",
                             str(report)]) == 0
    assert PromotionStateMachine.load(d).stage == "shadow"
    # a gate the candidate fails: no "next: advance" (advancing would roll back), exit 1
    strict = tmp_path / "strict.yaml"
    strict.write_text(json.dumps({"rollout": {"thresholds": {**RELAXED.model_dump(),
                                                             "relevancy": 0.999}}}))
    assert cli_main(["rollout", "replay", "--state-dir", d, "--log", str(log), "--index",
                     str(idx.root), "--candidate", str(cand), "--dataset", "synthetic",
                     "--config", str(strict), "--out", str(tmp_path / "strict.json")]) == 1
    err = capsys.readouterr().err
    assert "fails relevancy" in err and "next: ragpilot rollout advance" not in err


def test_replay_worse_candidate_ci_below_zero_rolls_back(served, world, scorer, tmp_path):
    idx, res, gold = served
    rows, lines = read_log(export_log(served, world, TERSE, tmp_path / "log.jsonl"))
    ev = ReplayEvaluator(idx, gold=gold, scorer=scorer, resources=res, thresholds=RELAXED)
    rep = ev.compare(rows, TERSE.config_hash, WORSE, source="log.jsonl", lines=lines)
    assert rep.kind == "offline" and rep.paired and rep.n == N
    assert rep.diff < -0.05 and rep.ci_high < 0
    assert rep.meta["gold"]["candidate_f1"] < rep.meta["gold"]["stable_f1"]
    # gold F1 as R: the same direction, only rows with gold
    ev_f1 = ReplayEvaluator(idx, gold=gold, scorer=scorer, resources=res, thresholds=RELAXED,
                            relevancy="f1")
    rep_f1 = ev_f1.compare(rows, TERSE.config_hash, WORSE, limit=20)
    assert rep_f1.n == 20 and rep_f1.diff < 0
    assert rep_f1.meta["metrics"]["relevancy"].startswith("gold answer F1")
    sm = PromotionStateMachine.start(tmp_path / "ro", WORSE.config_hash, TERSE.config_hash,
                                     "synthetic", PromotionSettings(thresholds=RELAXED))
    d = sm.observe(rep)
    assert d.action == "rollback", d.reason  # judged per metric: quality shown worse
    assert d.reason == "offline report: critical metric worse than its margin: quality"


def test_replay_of_the_stable_config_itself_is_a_null_difference(served, world, scorer,
                                                                 tmp_path):
    idx, res, _ = served
    rows, lines = read_log(export_log(served, world, TERSE, tmp_path / "log.jsonl", n=12))
    rep = ReplayEvaluator(idx, scorer=scorer, resources=res).compare(
        rows, TERSE.config_hash, TERSE, lines=lines, source="log.jsonl")
    assert rep.n == 12 and abs(rep.diff) < 0.01 and "gold" not in rep.meta
    assert rep.candidate.relevancy == pytest.approx(rep.stable.relevancy)


# --------------------------------------------------------------------------- bad input


def _row(**kw):
    row = {"id": "i1", "ts": 1.0, "question": "Which company was founded first?",
           "variant_id": "stab1e", "route": "stable", "propensity": 1.0, "answer": "Vornacle",
           "context_ids": [], "citations": [], "latency_ms": {"retrieve": 1.0},
           "tokens_in": 3, "tokens_out": 1, "shadow": False, "parent_id": None,
           "scores": None, "error": False, "reward": None, "feedback_ts": None}
    row.update(kw)
    return row


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in rows))
    return str(path)


@pytest.mark.parametrize("rows, extra, field", [
    ([_row(), "{not json", _row()], [], "log.jsonl:2"),
    ([_row(), [1, 2]], [], "log.jsonl:2: expected a JSON object"),
    ([_row(), {"question": "q"}], [], "log.jsonl:2: field 'variant_id'"),
    ([_row()], ["--stable", "0123456789ab"], "--stable: no row of"),
    ([_row(shadow=True), _row(error=True)], [], "--log: "),
    ([], [], "--log: "),
    ([_row(), _row(question="")], [], "log.jsonl:2: field 'question'"),
    ([_row(context_ids=["no-such-passage"])], [], "log.jsonl:1: context id 'no-such-passage'"),
    ([_row()], ["--relevancy", "bleu"], "--relevancy: must be one of"),
    ([_row()], ["--relevancy", "f1"], "--relevancy: f1 needs gold answers"),
    ([_row()], ["--limit", "0"], "--limit: must be >= 1"),
])
def test_cli_replay_bad_input_exits_2_naming_the_field(served, tmp_path, capsys, rows, extra,
                                                       field):
    log = _write(tmp_path / "log.jsonl", rows)
    cand = tmp_path / "c.yaml"
    cand.write_text(TERSE.to_yaml())
    argv = ["rollout", "replay", "--state-dir", str(tmp_path / "ro"), "--log", log,
            "--index", str(served[0].root), "--candidate", str(cand)]
    if "--stable" not in extra:
        argv += ["--stable", "stab1e"]
    assert cli_main(argv + extra) == 2
    assert field in capsys.readouterr().err


def test_cli_replay_argument_errors(served, tmp_path, capsys):
    log = _write(tmp_path / "log.jsonl", [_row()])
    cand = tmp_path / "c.yaml"
    cand.write_text(TERSE.to_yaml())
    base = ["rollout", "replay", "--state-dir", str(tmp_path / "ro"), "--log", log]
    cases = [
        (["--index", str(served[0].root), "--candidate", TERSE.config_hash, "--stable", "s"],
         "--candidate: replay needs"),
        (["--candidate", str(cand), "--stable", "stab1e"], "--index: give the served index"),
        (["--index", str(served[0].root), "--candidate", str(cand)], "--stable: required"),
        (["--index", str(served[0].root), "--candidate", str(cand), "--stable", "stab1e",
          "--log", str(tmp_path / "absent.jsonl")], "absent.jsonl: interaction log does not"),
    ]
    for extra, msg in cases:
        assert cli_main(base + extra) == 2, msg
        assert msg in capsys.readouterr().err
    # an index of another corpus replayed as the synthetic dataset: its gold would match no
    # context, so the replay is refused instead of scoring both arms against unreachable gold
    from rag.corpus import Corpus
    from rag.indexset import IndexSet
    from rag.types import Passage

    other = IndexSet.create(Corpus([Passage("x", "Some other text.", "X")]), tmp_path / "other",
                            show_progress=False)
    assert cli_main(base + ["--index", str(other.root), "--candidate", str(cand), "--stable",
                            "stab1e", "--dataset", "synthetic"]) == 2
    assert "index built from corpus" in capsys.readouterr().err
    # an active rollout: the replayed candidate must be its candidate
    d = str(tmp_path / "active")
    from serving.store import Interaction, SQLiteStore

    store = SQLiteStore(tmp_path / "served.sqlite")
    for i, v in enumerate(("stab1e", "abc123def456")):  # both deployed and serving
        store.log_interaction(Interaction(f"i{i}", "q", v, "split", 1.0, "a"))
    store.close()
    assert cli_main(["rollout", "start", "--state-dir", d, "--candidate", "abc123def456",
                     "--stable", "stab1e", "--store", str(tmp_path / "served.sqlite")]) == 0
    assert cli_main(["rollout", "replay", "--state-dir", d, "--log", log, "--index",
                             str(served[0].root), "--candidate", str(cand)]) == 2
    assert f"--candidate: config hash {TERSE.config_hash} is not the candidate" in \
        capsys.readouterr().err


def test_api_errors_are_typed():
    with pytest.raises(ConfigError) as e:
        stable_rows([_row(question=" ")], "stab1e")
    assert e.value.field == "rows[0].question"
    with pytest.raises(ConfigError) as e:
        stable_rows([_row(latency_ms={})], "stab1e")
    assert e.value.field == "rows[0].latency_ms"
    with pytest.raises(DataError) as e:
        stable_rows([_row(), _row(citations="1")], "stab1e", source="f.jsonl", lines=[4, 9])
    assert (e.value.path, e.value.line) == ("f.jsonl", 9)
    with pytest.raises(ConfigError) as e:
        ReplayEvaluator(object(), relevancy="bleu")
    assert e.value.field == "relevancy"
