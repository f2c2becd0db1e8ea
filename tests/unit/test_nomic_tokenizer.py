"""The nomic port's tokenizer (rag.nomic_port): the GGUF's llama.cpp-style vocabulary maps
back to BERT WordPiece, and the uncased tokenizer built from it adds [CLS]/[SEP], lower-cases,
strips accents, splits into ##pieces and truncates with the specials counted. No weights."""

from __future__ import annotations

from rag.nomic_port import bert_tokenizer, wordpiece_vocab

GGUF = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581the", "\u2581cafe", "\u2581play", "ing",
        "\u2581,", "\u2581[", "s", "\u2581"]


def test_vocab_round_trip():
    vocab = wordpiece_vocab(GGUF)
    assert vocab == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cafe", "play", "##ing", ",",
                     "[", "##s", ""]


def test_tokenizer_uncased_wordpiece_with_specials():
    tok = bert_tokenizer(wordpiece_vocab(GGUF), max_length=16, cls_id=2, sep_id=3)
    assert tok.encode("The CAFÉ playing, plays").ids == [2, 4, 5, 6, 7, 8, 6, 10, 3]
    assert tok.encode("zebra").ids == [2, 1, 3]  # unknown word -> [UNK]
    long = tok.encode("the " * 40).ids
    assert len(long) == 16 and long[0] == 2 and long[-1] == 3  # truncation keeps [SEP]
