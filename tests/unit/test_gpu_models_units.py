"""The GPU run's plumbing that needs no model: the log-probability judge backend under the
order swap, and the reassembly of model files from the pieces that travel to a device."""

from __future__ import annotations

import hashlib
import json

import pytest

from rag.metrics.judge import PairwiseJudge
from rag.metrics.pairwise_judge import LogprobJudgeBackend, judge_stats


def _fake_lm(prefer_first: float, quality: dict[str, float]):
    """A judge LM whose log-odds for "A" = slot bias + (quality of A - quality of B)."""
    def choice_logprobs(chats, choices):
        assert tuple(choices) == ("A", "B")
        out = []
        for chat in chats:
            user = chat[-1]["content"]
            a = user.split("Answer A: ")[1].split("\n")[0]
            b = user.split("Answer B: ")[1].split("\n")[0]
            d = prefer_first + quality[a] - quality[b]
            out.append([d / 2, -d / 2])
        return out
    return choice_logprobs


def test_logprob_backend_reads_the_likelier_letter_and_the_swap_finds_position_bias():
    quality = {"Paris": 2.0, "Lyon": 0.0, "Nice": 1.9}
    items = [("capital of France?", [], "Paris", "Lyon"),   # clear: A wins in both orders
             ("capital of France?", [], "Paris", "Nice")]   # close: the slot bias decides
    judge = PairwiseJudge(LogprobJudgeBackend(_fake_lm(0.5, quality), "fake"))
    clear, close = judge.compare_batch(items)
    assert (clear.forward, clear.backward, clear.winner) == ("A", "A", "A")
    assert clear.margin == pytest.approx(2.0)  # the order-averaged log-odds drops the bias
    assert (close.forward, close.backward, close.winner) == ("A", "B", "tie")
    assert close.margin == pytest.approx(0.1)  # still the better answer, by its margin
    st = judge_stats([clear, close], [1.0, 1.0], [0.0, 0.0])
    assert st["position_bias"] == 0.5 and st["tie_rate"] == 0.5
    assert st["agreement_with_f1_preference"] == 0.5


def test_logprob_backend_tie_margin():
    quality = {"x": 0.0, "y": 0.05}
    backend = LogprobJudgeBackend(_fake_lm(0.0, quality), "fake", tie_margin=0.1)
    (r,) = backend.judge_batch([("q", [], "x", "y")])
    assert r.verdict == "tie" and r.margin == pytest.approx(-0.05)


def _pieces(tmp_path, files: dict[str, bytes], step: int):
    stream = b"".join(files.values())
    pdir = tmp_path / "pieces"
    pdir.mkdir()
    for k in range(0, len(stream), step):
        (pdir / f"p{k // step:02d}").write_bytes(stream[k:k + step])
    man, off = [], 0
    for name, data in files.items():
        man.append({"key": name, "dest": f"models/{name}.gguf", "offset": off,
                    "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        off += len(data)
    mpath = tmp_path / "pieces.json"
    mpath.write_text(json.dumps({"piece_bytes": step, "total": off, "files": man}))
    return pdir, mpath


def test_assemble_rebuilds_each_complete_file_and_skips_one_with_a_missing_piece(tmp_path,
                                                                                  capsys):
    from bench.gpu_models import assemble

    files = {"a": bytes(range(256)) * 3, "b": b"xyz" * 100, "c": b"0123456789" * 40}
    pdir, mpath = _pieces(tmp_path, files, step=100)
    (pdir / "p12").unlink()  # a piece of "c" (bytes 1068-1467) never arrived
    assemble(pdir, mpath, tmp_path / "cache")
    assert (tmp_path / "cache/models/a.gguf").read_bytes() == files["a"]
    assert (tmp_path / "cache/models/b.gguf").read_bytes() == files["b"]
    assert not (tmp_path / "cache/models/c.gguf").exists()
    assert "c: pieces [12] missing" in capsys.readouterr().out


def test_assemble_drops_a_file_whose_bytes_do_not_hash_to_the_manifest(tmp_path, capsys):
    from bench.gpu_models import assemble

    pdir, mpath = _pieces(tmp_path, {"a": b"abc" * 50}, step=64)
    (pdir / "p01").write_bytes(b"Z" * 64)  # corrupted in transit
    assemble(pdir, mpath, tmp_path / "cache")
    assert not (tmp_path / "cache/models/a.gguf").exists()
    assert "MISMATCH" in capsys.readouterr().out
