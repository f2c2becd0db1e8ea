"""CLI inputs an audit (stop 56) found answered by a traceback or accepted wrongly; each is
exit 2 naming the flag now, and leaves nothing behind."""

from __future__ import annotations

import json

import pytest

from serving.cli import main


@pytest.mark.parametrize("files, message", [
    ({"summary.json": "{bad"}, "summary.json is not JSON"),
    ({"summary.json": "[1, 2]"}, "not a tune run's summary"),
    ({"summary.json": "{}"}, "not a tune run's summary"),
    ({"summary.json": json.dumps({"dataset": "synthetic"})}, "has no best_config.yaml"),
    ({"summary.json": json.dumps({"dataset": "synthetic"}), "best_config.yaml": "rag: {}\n"},
     "has no curve.jsonl"),
    ({"summary.json": json.dumps({"dataset": "synthetic"}), "best_config.yaml": "rag: {}\n",
      "curve.jsonl": '{"reward": 0.5}\n{bad\n'}, "curve.jsonl is not the run's curve"),
])
def test_report_on_a_run_directory_that_is_not_a_finished_run(tmp_path, capsys, files,
                                                              message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert main(["report", "--run", str(tmp_path), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --run: ") and message in err, err


def test_bad_port_and_a_mistyped_manifest_are_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "run"
    for port in ("-1", "70000", "http"):
        with pytest.raises(SystemExit) as e:  # argparse, before the run directory is made
            from serving.cli import build_parser

            build_parser().parse_args(["tune", "--metrics-port", port, "--out", str(out)])
        assert e.value.code == 2
    assert main(["tune", "--dataset", "synthetic", "--metrics-port", "-1", "--out",
                 str(out)]) == 2
    assert "--metrics-port" in capsys.readouterr().err and not out.exists()
    (tmp_path / "dir.prom").mkdir()
    assert main(["tune", "--dataset", "synthetic", "--metrics-textfile",
                 str(tmp_path / "dir.prom"), "--out", str(out)]) == 2
    assert "error: --metrics-textfile: " in capsys.readouterr().err and not out.exists()
    cand = tmp_path / "cand.yaml"
    cand.write_text("rag:\n  variant: bm25\n")
    stable = tmp_path / "stable.yaml"
    stable.write_text("rag:\n  variant: hybrid\n")
    assert main(["rollout", "start", "--state-dir", str(tmp_path / "st"), "--candidate",
                 str(cand), "--stable", str(stable), "--manifest",
                 str(tmp_path / "typo.json")]) == 2
    assert "manifest: file" in capsys.readouterr().err
    assert not (tmp_path / "st" / "state.json").exists()


def test_tune_refuses_to_mix_a_new_run_into_a_finished_one(tmp_path, capsys):
    """`tune --out` into a finished run replaced its best config and holdout but left its
    report.md and plots beside them (the CLI audit). Now exit 2, unless --overwrite, which
    removes the old run's files (and only those) first."""
    from rl.tuner.run import RUN_FILES, _claim_run_directory

    out = tmp_path / "run"
    (out / "holdout").mkdir(parents=True)
    for name in ("summary.json", "report.md", "best_config.yaml", "notes.txt"):
        (out / name).write_text("old")
    assert main(["tune", "--dataset", "synthetic", "--out", str(out), "--no-mlflow"]) == 2
    err = capsys.readouterr().err
    assert "error: --out: " in err and "--overwrite" in err
    assert (out / "report.md").read_text() == "old"
    _claim_run_directory(out, overwrite=True, resumed=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert "report.md" in RUN_FILES and "holdout" in RUN_FILES
    _claim_run_directory(tmp_path / "new", overwrite=False, resumed=False)  # nothing there


def test_a_malformed_split_manifest_and_a_bad_pipeline_call_are_named(tmp_path):
    from rag.corpus.hygiene import SplitManifest
    from rag.errors import ConfigError, DataError
    from rag.pipeline import Pipeline

    for text in ("{bad", "[1, 2]", "{}"):
        (tmp_path / "split.json").write_text(text)
        with pytest.raises(DataError, match="split.json"):
            SplitManifest.load(tmp_path / "split.json")
    with pytest.raises(ConfigError, match="indexes"):
        Pipeline(None)
    p = Pipeline(object(), {"k": 3})  # a mapping is validated into a RAGConfig
    assert p.config.k == 3
    with pytest.raises(ConfigError) as e:
        Pipeline(object(), {"kk": 3})
    assert e.value.field == "rag.kk"
    for history in ("hello", [{"bogus": 1}], [1]):
        with pytest.raises(ConfigError, match="history"):
            p.retrieval_query("q?", history)
    with pytest.raises(ConfigError, match="batch_size"):
        p.run_batch(["q?"], batch_size=0)


def test_eval_dry_run_checks_the_whole_config_file(tmp_path, capsys):
    """`eval --dry-run` passed a config whose `indexes:` section or generator `index` and
    `tuner-eval` refuse (the second audit)."""
    f = tmp_path / "c.yaml"
    for text, message in [("rag: {k: 3}\nindexes: {bogus: 1}\n", "indexes.bogus"),
                          ("rag: {k: 3}\nindexes: [1, 2]\n", "indexes"),
                          ("rag: {generator: nope}\n", "'nope'")]:
        f.write_text(text)
        assert main(["eval", "--dataset", "synthetic", "--dry-run", "--config", str(f)]) == 2
        assert message in capsys.readouterr().err, text
    f.write_text("rag: {k: 3}\nindexes: {lexical: bm25s}\n")
    assert main(["eval", "--dataset", "synthetic", "--dry-run", "--config", str(f)]) == 0


@pytest.mark.parametrize("command", [["select", "run"], ["select", "ablate", "--quick"]])
def test_select_checks_its_output_path_before_training(tmp_path, capsys, monkeypatch, command):
    import rl.selection.ablate as ablate

    def no_run(*a, **k):  # must not be reached: the run takes minutes and starts Ray
        raise AssertionError("the run started before --out was checked")

    monkeypatch.setattr(ablate, "run_dataset", no_run)
    assert main([*command, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out: ") and "is a directory" in err, err
    (tmp_path / "file").write_text("x")
    assert main([*command, "--out", str(tmp_path / "file" / "rows.json")]) == 2
    assert "error: --out: cannot create" in capsys.readouterr().err
