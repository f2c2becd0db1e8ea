"""`ragpilot eval` on a user's own HotpotQA file, end to end (tantivy index built in tmp, the
extractive reader, no model weights): every question is evaluated, and a slow model load is
reported apart instead of landing in the first question's latency."""

import json
import time

from tests.unit.test_silent_zeros import hotpot_record, write_jsonl

from serving.cli import main


def test_own_file_evaluated_in_full_and_model_load_kept_out_of_latency(tmp_path, monkeypatch,
                                                                       capsys):
    import rag.generation.factory as factory
    from rag.indexset import IndexSet

    real_make, real_get = factory.make_generator, IndexSet._get

    def slow_make(*args, **kwargs):
        time.sleep(1.0)  # stands in for a multi-second model load
        return real_make(*args, **kwargs)

    def slow_get(self, name, load, build):
        if name not in self._cache:
            time.sleep(1.0)  # an index (or its query encoder) loaded on first use
        return real_get(self, name, load, build)

    monkeypatch.setattr(factory, "make_generator", slow_make)
    monkeypatch.setattr(IndexSet, "_get", slow_get)
    # named like the built-in dataset, ids the project's manifest does not know: before, this
    # evaluated 0 questions with exit 0
    path = write_jsonl(tmp_path / "hotpotqa.jsonl", [hotpot_record(i) for i in range(30)])
    out = tmp_path / "e"
    assert main(["eval", "--dataset", path, "--set", "variant=bm25", "--limit", "10",
                 "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["n"] == 10 and s["split"] == "all" and s["dataset"] == "hotpotqa-local"
    assert s["model_load_s"] >= 2.0
    assert s["total_p95_ms"] < 500.0 and s["generate_p95_ms"] < 500.0
    assert s["recall@k"] > 0.9
    assert main(["eval", "--dataset", path, "--set", "variant=bm25", "--out",
                 str(tmp_path / "all")]) == 0
    assert json.loads((tmp_path / "all" / "summary.json").read_text())["n"] == 30
    assert "evaluating 30 questions of hotpotqa-local (split all)" in capsys.readouterr().err
