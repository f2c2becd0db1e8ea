"""The CLI: readable output, and exit code 2 naming the field or file:line on bad input."""

import subprocess
import sys

import pytest

from serving.cli import main


@pytest.fixture(scope="module")
def index_dir(world_indexes):
    return str(world_indexes.root)


def test_query_prints_answer_and_citations(index_dir, world, capsys):
    e = world.examples[0]
    assert main(["query", e.question, "--index", index_dir, "--set", "variant=bm25"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Q: {e.question}") and "A: " in out and "[1]" in out


def test_eval_writes_outputs(index_dir, tmp_path, capsys):
    rc = main(["eval", "--dataset", "synthetic", "--split", "all", "--index", index_dir,
               "--limit", "12", "--set", "variant=bm25", "--out", str(tmp_path / "e")])
    assert rc == 0
    for f in ("predictions.jsonl", "contexts.jsonl", "summary.json", "summary.csv"):
        assert (tmp_path / "e" / f).exists()
    assert "f1" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "needle"), [
    (["query", "q?", "--set", "kk=3"], "rag.kk: unknown key"),
    (["query", "q?", "--set", "k=0"], "rag.k:"),
    (["query", "q?", "--set", "k=99"], "rag.k:"),
    (["query", "   "], "question"),
    (["query", "q?", "--set", "k"], "--set"),
])
def test_bad_input_exit_code_2(index_dir, argv, needle, capsys):
    assert main([*argv, "--index", index_dir]) == 2
    assert needle in capsys.readouterr().err


def test_missing_paths_and_malformed_lines(tmp_path, index_dir, capsys):
    assert main(["eval", "--dataset", str(tmp_path / "none.jsonl"), "--out",
                 str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": oops}\n')
    assert main(["index", "--dataset", str(bad), "--out", str(tmp_path / "i")]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rag:\n  fusion_weight: 2\n")
    assert main(["query", "q?", "--index", index_dir, "--config", str(cfg)]) == 2
    assert "rag.fusion_weight" in capsys.readouterr().err
    assert main(["query", "q?", "--index", str(tmp_path)]) == 2
    assert "not an index directory" in capsys.readouterr().err


def test_console_script_exit_code():
    r = subprocess.run([sys.executable, "-m", "serving.cli", "query", "q?", "--index", "/nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ")


def test_data_report(capsys):
    import json

    assert main(["data-report", "--dataset", "synthetic"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["passages"] == 300 and rep["categories"]["bridge"] == 80
    assert rep["leakage"]["in_gold"] == rep["leakage"]["checked"] > 0
