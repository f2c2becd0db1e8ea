"""Long CLI commands say what they do in a non-interactive log (rag.progress): `index`, `eval`
and `tune` on a tiny BEIR folder, stderr captured (not a terminal), write one start and one end
line per stage, with the counts of the counted ones. Timing is not asserted."""

import re

import yaml
from tests.test_tune_own_data import SMALL, _beir

from serving.cli import main

STAMP = re.compile(r"\[\d\d:\d\d:\d\d\] (.*)")


def _stage_lines(err: str) -> list[str]:
    return [m.group(1) for m in map(STAMP.fullmatch, err.splitlines()) if m]


def _done(lines: list[str], what: str, count: str = "") -> None:
    """`what: start` then `what: done[, count] in N s` among `lines`, in that order."""
    start = [i for i, x in enumerate(lines) if x.startswith(f"{what}: start")]
    end = [i for i, x in enumerate(lines)
           if re.fullmatch(re.escape(f"{what}: done{count} in ") + r"[\d.]+ s", x)]
    assert start and end and start[0] < end[0], (what, lines)


def test_index_eval_and_tune_log_their_stages_with_counts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rag.index.dense.cache_dir", lambda: tmp_path / "emb")  # encode
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    data = _beir(tmp_path / "mybeir")  # 42 passages, 21 questions
    idx = tmp_path / "idx"
    assert main(["index", "--dataset", str(data), "--out", str(idx)]) == 0
    lines = _stage_lines(capsys.readouterr().err)
    embed = next(x for x in lines if x.startswith("embed 42 passages ("))
    assert embed.endswith(": start (42 passages)")
    _done(lines, embed.removesuffix(": start (42 passages)"), ", 42/42 passages")
    for name in ("bm25-tantivy", "dense-flat", "graph"):
        _done(lines, f"build index {name} (42 passages)")

    assert main(["eval", "--dataset", str(data), "--index", str(idx), "--set", "k=3",
                 "--out", str(tmp_path / "eval")]) == 0
    lines = _stage_lines(capsys.readouterr().err)
    name = next(x for x in lines if x.startswith("eval ")).split(":")[0]
    assert re.fullmatch(r"eval [0-9a-f]{12}", name), lines
    _done(lines, f"{name}: load models and indexes")
    _done(lines, "load index bm25-tantivy (42 passages)")
    _done(lines, f"{name}: answer", ", 21/21 questions")
    _done(lines, f"{name}: score 21 answers")

    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump(SMALL))
    assert main(["tune", "--dataset", str(data), "--method", "random", "--budget", "3",
                 "--settings", str(settings), "--no-mlflow", "--out",
                 str(tmp_path / "tune")]) == 0
    lines = _stage_lines(capsys.readouterr().err)
    opened = next(x for x in lines if x.startswith("tune: open "))  # the resolved path
    assert opened.endswith("mybeir (load, split, check gold): start"), lines
    _done(lines, opened.removesuffix(": start"))
    search = [x for x in lines if x.startswith("tune: search random: ")]
    assert search[0] == "tune: search random: start (3 query-evaluations)", lines
    assert re.fullmatch(r"tune: search random: done, \d+/3 query-evaluations in [\d.]+ s",
                        search[-1]), search
    _done(lines, "tune: Pareto front of the full-fidelity configs, operating point")
    assert any(re.fullmatch(r"eval [0-9a-f]{12}: answer: done, 10/10 questions in [\d.]+ s", x)
               for x in lines), lines  # the holdout half


def test_tune_counts_query_evaluations_inside_the_first_trial(tmp_path, monkeypatch) -> None:
    """`tune: search` advances with every query-evaluation the evaluator computes, so a log
    shows how far the first trial got (with an estimate of the rest) before the trial ends.
    Every count is written here (INTERVAL_S 0); stdout and stderr go to one stream, so the
    CLI's `trial ...` line (written when a trial ends) is ordered against the count lines."""
    import io
    import sys

    from rag import progress

    monkeypatch.setenv("RAGPILOT_CACHE", str(tmp_path / "cache"))  # fresh rows: computed here
    monkeypatch.setattr("rag.index.dense.cache_dir", lambda: tmp_path / "emb")
    monkeypatch.setattr("rl.common.data.cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    data = _beir(tmp_path / "mybeir")
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump(SMALL))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", out)
    assert main(["tune", "--dataset", str(data), "--method", "random", "--budget", "25",
                 "--settings", str(settings), "--no-mlflow", "--out",
                 str(tmp_path / "tune")]) == 0
    text = out.getvalue().splitlines()
    first_trial = next(i for i, x in enumerate(text) if x.startswith("trial "))
    size = int(re.match(r"trial \S+: (\d+) queries", text[first_trial]).group(1))
    count = re.compile(r"tune: search random: (\d+)/25 query-evaluations \(\d+%\), "
                       r"[\d.]+ (?:s|min), ~[\d.]+ (?:s|min) left")
    counts = map(count.fullmatch, _stage_lines("\n".join(text[:first_trial])))
    done = [int(m.group(1)) for m in counts if m]
    assert size >= 2, text[first_trial]
    # a line for every query-evaluation from inside the first trial (each with an estimate;
    # the ticker may repeat a count while one query is slow), then the trial's own count
    assert sorted(set(done)) == list(range(1, size + 1)), done
    assert done == sorted(done) and done[-1] == size, done
