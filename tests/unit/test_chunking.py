"""Token-based chunking: window sizes, overlap, title prefix, parent links, bounds."""

import pytest

from rag.corpus.chunking import chunk_passages
from rag.errors import ConfigError
from rag.types import Passage


def test_long_passage_is_windowed_with_overlap():
    words = [f"w{i}" for i in range(500)]
    p = Passage("doc", " ".join(words), "Title")
    chunks = chunk_passages([p], max_tokens=200, overlap=40, min_tokens=150)
    # starts 0, 160, 320, 480 -> the 20-token tail folds into the third window
    assert [c.id for c in chunks] == ["doc#0", "doc#1", "doc#2"]
    bodies = [c.text.removeprefix("Title: ").split() for c in chunks]
    assert [len(b) for b in bodies] == [200, 200, 180]
    assert bodies[0][-40:] == bodies[1][:40]  # overlap
    assert bodies[-1][-1] == "w499"  # nothing lost
    assert all(c.text.startswith("Title: ") and c.metadata["parent"] == "doc" for c in chunks)
    assert [c.metadata["start_token"] for c in chunks] == [0, 160, 320]


def test_short_passage_kept_whole_and_bad_bounds():
    p = Passage("s", "short text here", "T")
    assert chunk_passages([p]) == [p]
    with pytest.raises(ConfigError, match="overlap"):
        chunk_passages([p], max_tokens=100, overlap=100)
    with pytest.raises(ConfigError, match="max_tokens"):
        chunk_passages([p], max_tokens=0)


def test_tokenizer_counts(tmp_path):
    from transformers import AutoTokenizer

    from rag.models import default_registry

    tok = AutoTokenizer.from_pretrained(str(default_registry().get("minilm").resolve()))
    p = Passage("d", " ".join(["internationalisation"] * 300), "")
    chunks = chunk_passages([p], max_tokens=250, overlap=50, tokenizer=tok)
    assert len(chunks) > 2  # one word is several word pieces
    for c in chunks:
        assert len(tok(c.text, add_special_tokens=False)["input_ids"]) <= 250
