"""rag.progress: silent outside `reporting()`; in a log, a start line, count lines at most every
INTERVAL_S with the share done and an estimate of the rest, and an end line with the count;
a live bar on a terminal; a failed stage says so and re-raises."""

import io
import re

import pytest

from rag import progress


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _lines(buf: io.StringIO) -> list[str]:
    """The lines without their `[HH:MM:SS] ` stamp (checked here once)."""
    out = buf.getvalue().splitlines()
    assert all(re.match(r"\[\d\d:\d\d:\d\d\] ", x) for x in out), out
    return [x[11:] for x in out]


def test_nothing_is_shown_outside_reporting(capsys):
    with progress.stage("embed", 10, "passages") as st:
        st.advance(10)
    progress.say("hello")
    assert not progress.active()
    assert capsys.readouterr() == ("", "")


def test_a_log_gets_counts_at_most_every_interval_with_an_estimate():
    buf, clock = io.StringIO(), Clock()
    with progress.reporting(buf):
        with progress.Stage("embed 100 passages", 100, "passages", clock=clock) as st:
            clock.t += 4
            st.update(10)  # 4 s: too soon for a line
            clock.t += 6
            st.update(25)  # 10 s: 25 done at 2.5/s -> 75 left take 30 s
            clock.t += 5
            st.update(40)  # 5 s after the last line: none
            clock.t += 10
            st.update(50)  # 25 s, 50 done -> 25 s left
            clock.t += 25
            st.update(100)
        progress.say("tune: 11 valid / 10 test questions")
    assert _lines(buf) == [
        "embed 100 passages: start (100 passages)",
        "embed 100 passages: 25/100 passages (25%), 10 s, ~30 s left",
        "embed 100 passages: 50/100 passages (50%), 25 s, ~25 s left",
        "embed 100 passages: done, 100/100 passages in 50.0 s",
        "tune: 11 valid / 10 test questions"]


def test_a_stage_without_a_total_and_a_failed_stage():
    buf, clock = io.StringIO(), Clock()
    with progress.reporting(buf):
        with progress.Stage("build index graph (42 passages)", clock=clock):
            clock.t += 130
        with pytest.raises(KeyError), progress.Stage("load index dense-flat", clock=clock):
            clock.t += 2.5
            raise KeyError("x")
    assert _lines(buf) == ["build index graph (42 passages): start",
                           "build index graph (42 passages): done in 130.0 s",
                           "load index dense-flat: start",
                           "load index dense-flat: failed after 2.5 s"]


def test_minutes_in_long_estimates():
    buf, clock = io.StringIO(), Clock()
    with progress.reporting(buf), progress.Stage("search", 1000, "query-evaluations",
                                                 clock=clock) as st:
        clock.t += 60
        st.update(100)  # 900 left at 100/min
    assert _lines(buf)[1] == "search: 100/1000 query-evaluations (10%), 60 s, ~9.0 min left"


def test_a_terminal_gets_a_live_bar_not_lines():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    buf = Tty()
    with progress.reporting(buf), progress.stage("answer", 3, "questions") as st:
        st.advance(3)
    text = buf.getvalue()
    assert "answer" in text and "3/3" in text and ": start" not in text


def test_reporting_nests_and_restores():
    outer, inner = io.StringIO(), io.StringIO()
    with progress.reporting(outer):
        with progress.reporting(inner):
            progress.say("a")
        progress.say("b")
    assert not progress.active()
    assert _lines(inner) == ["a"] and _lines(outer) == ["b"]


def test_a_negative_total_is_refused():
    with pytest.raises(ValueError, match="total"):
        progress.stage("x", -1)


def test_a_corpus_is_embedded_in_counted_chunks_and_comes_back_in_order(tmp_path, monkeypatch):
    """300 passages: 3 chunks of 100 (longest first, never a tail small enough for the encoder's
    query-time path), the vectors back in corpus order, and the stage counts them."""
    import numpy as np

    from rag.corpus import Corpus
    from rag.index import dense
    from rag.types import Passage

    class LengthEncoder:
        name, fingerprint, dim = "length", "len0", 1

        def __init__(self):
            self.calls = []

        def encode(self, texts, batch_size=64):
            self.calls.append([len(t) for t in texts])
            return np.array([[len(t)] for t in texts], dtype=np.float32)

    monkeypatch.setattr(dense, "cache_dir", lambda: tmp_path)
    corpus = Corpus([Passage(f"p{i}", "x" * ((i * 37) % 101 + 1)) for i in range(300)])
    enc, buf = LengthEncoder(), io.StringIO()
    with progress.reporting(buf):
        vecs = dense.embed_corpus(corpus, enc, use_cache=False)
    assert vecs[:, 0].tolist() == [len(p.text) for p in corpus]
    assert [len(c) for c in enc.calls] == [100, 100, 100]
    flat = [n for c in enc.calls for n in c]
    assert flat == sorted(flat, reverse=True)
    lines = _lines(buf)
    assert lines[0] == "embed 300 passages (length): start (300 passages)"
    assert re.fullmatch(r"embed 300 passages \(length\): done, 300/300 passages in [\d.]+ s",
                        lines[-1]), lines


def test_the_ticker_speaks_for_the_innermost_stage_when_it_is_silent(monkeypatch):
    """A stage without a line for INTERVAL_S gets one from the ticker (an uncounted one says
    how long so far, a counted one its count), the innermost only, and none once it ended."""
    import time

    while progress._ticker["thread"] is not None:  # an earlier test's, asleep for TICK_S
        time.sleep(0.05)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.3)
    monkeypatch.setattr(progress, "TICK_S", 0.02)
    buf = io.StringIO()
    with progress.reporting(buf):
        with progress.stage("search", 5, "trials") as outer:
            with progress.stage("build index graph"):
                time.sleep(1.0)
            outer.advance(2)
            time.sleep(0.45)
        time.sleep(0.4)
    lines = _lines(buf)
    assert lines[:2] == ["search: start (5 trials)", "build index graph: start"]
    end = next(i for i, x in enumerate(lines) if x.startswith("build index graph: done"))
    inner, after = lines[2:end], lines[end + 1:]
    assert len(inner) >= 2 and all(re.fullmatch(r"build index graph: \d+ s so far", x)
                                   for x in inner), lines
    assert re.fullmatch(r"search: 2/5 trials \(40%\), \d+ s, ~\d+ s left", after[0]), lines
    assert re.fullmatch(r"search: done, 2/5 trials in [\d.]+ s", lines[-1]), lines
    assert not progress._open


def test_advance_counts_into_the_innermost_open_stage_of_its_unit(monkeypatch):
    """`progress.advance(n, unit)` from code that holds no stage: the innermost open stage
    counting `unit` takes it (an inner stage of another unit does not); nothing happens
    outside `reporting()` or without such a stage."""
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # every count is a line
    progress.advance(3, "query-evaluations")  # outside reporting: nothing to count into
    buf = io.StringIO()
    with progress.reporting(buf):
        progress.advance(1, "query-evaluations")  # no stage open: nothing
        with progress.stage("tune: search", 10, "query-evaluations") as search:
            with progress.stage("build index dense", 4, "passages") as build:
                progress.advance(2, "query-evaluations")
                progress.advance(1, "passages")
            progress.advance(1, "trials")  # no stage counts trials: nothing
    assert (search.done, build.done) == (2, 1)
    lines = _lines(buf)
    assert re.fullmatch(r"tune: search: 2/10 query-evaluations \(20%\), \d+ s, ~\d+ s left",
                        lines[2]), lines
    assert lines[-1].startswith("tune: search: done, 2/10 query-evaluations in "), lines
    assert not any("trials" in x for x in lines), lines


def test_progress_is_no_part_of_the_tuner_rows_fingerprint():
    """Cached tuner rows are keyed by a fingerprint of the code that computes them
    (`rows_version`): the per-query progress count is passed into `_compute` by its caller and
    `rag.progress` is outside the fingerprinted modules, so editing progress keeps every row."""
    import inspect

    from rl.common.fingerprint import module_closure, normalized_code
    from rl.kernel import evaluator as ev

    assert "rag.progress" not in module_closure(ev.ROWS_SOURCES, ev.ROWS_STOP)
    assert "rag.progress" not in module_closure(ev.QUALITY_SOURCES, ev.ROWS_STOP)
    compute = normalized_code(inspect.getsource(ev.TunerEvaluator._compute))
    assert "progress" not in compute and "QUERY_EVALUATIONS" not in compute, compute


def test_a_tune_search_counts_each_rung_result_of_its_trials(monkeypatch):
    """Under Ray Tune (trials in other processes) the driver's `tune: search` stage advances by
    each trial's new query-evaluations when a rung result arrives (rung sizes 3 then 6 of one
    trial, 3 of another: 6 + 3 counted, not 3 + 6 + 3)."""
    from types import SimpleNamespace

    from rl.kernel.evaluator import QUERY_EVALUATIONS
    from rl.tuner.tune_search import _Recorder

    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    rec, buf = _Recorder(), io.StringIO()
    a, b = SimpleNamespace(trial_id="a"), SimpleNamespace(trial_id="b")
    with progress.reporting(buf), progress.stage("tune: search", 20, QUERY_EVALUATIONS) as st:
        for trial, size in ((a, 3), (a, 6), (b, 3)):
            rec.on_trial_result(0, [], trial, {"query_evals": size, "node_id": None})
        assert st.done == 9
    assert [x.split(",")[0] for x in _lines(buf) if "/20" in x][:3] == [
        f"tune: search: {n}/20 query-evaluations ({p}%)" for n, p in ((3, 15), (6, 30), (9, 45))]
