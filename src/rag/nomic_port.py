"""nomic-embed-text-v1.5 in PyTorch, read straight from its F16 GGUF: a faithful port of the
nomic-bert encoder that llama.cpp runs, fast on CPU because it batches.

Architecture (from the GGUF's `nomic-bert.*` metadata and tensor names): token embeddings +
token-type row 0 (no learned positions), LayerNorm; 12 post-LayerNorm blocks of bias-free fused
QKV self-attention with rotary position embeddings (NeoX layout: rotate halves, base
`rope.freq_base` = 1000, the whole 64-dim head) and a bias-free SwiGLU MLP
(down(silu(gate(x)) * up(x))); mean pooling over real tokens, then L2 normalisation. F16
weights are widened to fp32 tensors once at load (~550 MB resident).

Tokenizer: the GGUF's vocabulary is bert-base-uncased WordPiece rewritten the llama.cpp way
(word starts carry "\u2581", continuations lose "##", "[...]" specials unchanged);
`wordpiece_vocab` undoes that and `HF tokenizers`' BertWordPiece (lower-case, accents
stripped) tokenises, adding [CLS] ... [SEP] as llama.cpp does.

Max length: 2048 tokens including [CLS]/[SEP] (`nomic-bert.context_length`, the trained
length and the llama.cpp runtime's n_ctx), so no SciFact abstract is cut and the port agrees
with llama.cpp on every text; longer texts are truncated. Texts are length-bucketed
(rag.batching) so batch-mates have similar lengths; padding is masked out of attention and
pooling, so a text's vector does not depend on its batch-mates (up to float rounding).

Agreement with llama.cpp (cosine >= 0.9999 on >= 20 texts) is tested in
tests/test_nomic_port.py; within that tolerance both runtimes give one embedding, so both
carry the same fingerprint (`<gguf fingerprint>-gguf`) and share cached embeddings/indexes.
Threads: `threads`, else $RAGPILOT_ENCODER_THREADS, else 1 (torch's intra-op pool is
process-wide: it is set for each encode call and restored after). `device="cuda"` runs the same
fp32 forward on a GPU (TF32 matmuls stay off, torch's default), for indexing a corpus in seconds
where a lent GPU exists; its vectors keep the shared fingerprint, checked against the CPU port.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag.batching import l2_normalize, length_buckets, pad_batch
from rag.errors import ConfigError

THREADS_ENV = "RAGPILOT_ENCODER_THREADS"
ARCH = "nomic-bert"


def wordpiece_vocab(gguf_tokens: Sequence[str]) -> list[str]:
    """The BERT WordPiece vocabulary (index = token id) behind a GGUF "bert" vocabulary:
    "\u2581word" -> "word", "piece" -> "##piece", "[CLS]"-style specials unchanged (the inverse
    of llama.cpp's convert_hf_to_gguf rewrite)."""
    out = []
    for tok in gguf_tokens:
        if tok.startswith("[") and tok.endswith("]"):
            out.append(tok)
        elif tok.startswith("\u2581"):
            out.append(tok[1:])
        else:
            out.append("##" + tok)
    return out


def bert_tokenizer(vocab: Sequence[str], max_length: int, cls_id: int = 101, sep_id: int = 102):
    """An uncased BERT WordPiece `tokenizers.Tokenizer` over `vocab`: adds [CLS]/[SEP],
    truncates to `max_length` tokens (specials included), no padding."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    tok.decoder = decoders.WordPiece()
    tok.enable_truncation(max_length)
    tok.no_padding()
    return tok


def read_gguf(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata {key: value}, tensors {name: float32 array in torch Linear layout (out, in)})."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not needed here
            continue
    tensors = {t.name: np.array(t.data, dtype=np.float32).reshape(
        tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
    return meta, tensors


class NomicPortEncoder:
    """The `rag.encoders.Encoder` contract on the torch port: `encode(texts) -> (n, 768)`
    float32, unit rows when `normalize`, in the order of `texts`. Prefixes are set by
    `rag.encoders._load` from the registry entry. `batch_size`: texts per forward pass;
    `max_tokens`: padded tokens per pass (bounds the attention memory)."""

    def __init__(self, name: str, path: Path, threads: int | None = None,
                 max_length: int | None = None, max_tokens: int = 8192, device: str = "cpu"):
        import torch

        from rag.llama_runtime import gguf_fingerprint

        if device not in ("cpu", "cuda"):
            raise ConfigError("device", f"must be cpu or cuda, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device", "cuda requested but no GPU is visible to torch")
        self.name, self.path, self.device = name, Path(path), device
        meta, tensors = read_gguf(self.path)
        if meta.get("general.architecture") != ARCH:
            raise ConfigError("encoder", f"{name}: the torch port runs {ARCH} GGUFs only, not "
                                         f"{meta.get('general.architecture')!r}")
        self.n_layer = int(meta[f"{ARCH}.block_count"])
        self.n_head = int(meta[f"{ARCH}.attention.head_count"])
        self.eps = float(meta[f"{ARCH}.attention.layer_norm_epsilon"])
        self.rope_base = float(meta[f"{ARCH}.rope.freq_base"])
        self.dim = int(meta[f"{ARCH}.embedding_length"])
        ctx = int(meta[f"{ARCH}.context_length"])
        self.max_length = int(max_length or ctx)
        if not 2 < self.max_length <= ctx:
            raise ConfigError("max_length", f"must be in (2, {ctx}], got {self.max_length}")
        self.max_tokens = int(max_tokens)
        self.threads = int(threads or os.environ.get(THREADS_ENV, 1))
        if self.threads < 1:
            raise ConfigError("threads", f"must be >= 1, got {self.threads}")
        self.w = {k: torch.from_numpy(v).to(device) for k, v in tensors.items()}
        self.tokenizer = bert_tokenizer(wordpiece_vocab(meta["tokenizer.ggml.tokens"]),
                                        self.max_length,
                                        int(meta.get("tokenizer.ggml.bos_token_id", 101)),
                                        int(meta.get("tokenizer.ggml.seperator_token_id", 102)))
        self.pad_id = int(meta.get("tokenizer.ggml.padding_token_id", 0))
        # same vectors as llama.cpp within cosine 1e-4 (tests/test_nomic_port.py): shared tag
        self.fingerprint = f"{gguf_fingerprint(self.path)}-gguf"
        self.query_prefix = self.document_prefix = ""
        self.calls = 0
        self._lock = threading.Lock()

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text: [CLS] ... [SEP], at most `max_length`."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str], batch_size: int = 16, show_progress: bool = False,
               normalize: bool = True) -> np.ndarray:
        """(n, dim) float32 in the order of `texts`; unit rows when `normalize`."""
        import torch

        texts = list(texts)
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.token_ids(texts)
        batches = length_buckets([len(x) for x in ids], batch_size, self.max_tokens)
        bar = None
        if show_progress:
            from tqdm import tqdm

            bar = tqdm(total=len(texts), desc=f"encode {self.name}", unit="text")
        with self._lock:
            before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                with torch.inference_mode():
                    for rows in batches:
                        tok, mask = pad_batch([ids[i] for i in rows], self.pad_id)
                        out[rows] = self._forward(torch.from_numpy(tok).to(self.device),
                                                  torch.from_numpy(mask).to(self.device)
                                                  ).cpu().numpy()
                        if bar:
                            bar.update(len(rows))
            finally:
                torch.set_num_threads(before)
        if bar:
            bar.close()
        return l2_normalize(out) if normalize else out

    def _rope(self, seq: int):
        import torch

        half = self.dim // self.n_head // 2
        inv = 1.0 / self.rope_base ** (torch.arange(half, dtype=torch.float64) / half)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)  # NeoX: first half and second half share angles
        return ang.cos().float().to(self.device), ang.sin().float().to(self.device)

    def _forward(self, ids, mask):
        """Mean-pooled last hidden state [batch, dim] (not normalised)."""
        import torch
        import torch.nn.functional as F

        w, eps, d = self.w, self.eps, self.dim
        b, s = ids.shape
        h = self.n_head
        hd = d // h
        x = F.embedding(ids, w["token_embd.weight"]) + w["token_types.weight"][0]
        x = F.layer_norm(x, (d,), w["token_embd_norm.weight"], w["token_embd_norm.bias"], eps)
        cos, sin = self._rope(s)
        keep = mask.bool()[:, None, None, :]  # key padding mask, broadcast over heads/queries

        def rotate(t):
            t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
            return t * cos + torch.cat([-t2, t1], dim=-1) * sin

        for i in range(self.n_layer):
            p = f"blk.{i}."
            qkv = F.linear(x, w[p + "attn_qkv.weight"]).view(b, s, 3, h, hd)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # [b, h, s, hd]
            a = F.scaled_dot_product_attention(rotate(q), rotate(k), v, attn_mask=keep)
            a = F.linear(a.transpose(1, 2).reshape(b, s, d), w[p + "attn_output.weight"])
            x = F.layer_norm(x + a, (d,), w[p + "attn_output_norm.weight"],
                             w[p + "attn_output_norm.bias"], eps)
            f = F.silu(F.linear(x, w[p + "ffn_gate.weight"])) * F.linear(x, w[p + "ffn_up.weight"])
            x = F.layer_norm(x + F.linear(f, w[p + "ffn_down.weight"]), (d,),
                             w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"],
                             eps)
        m = mask[:, :, None].to(x.dtype)
        return (x * m).sum(1) / m.sum(1).clamp_min(1e-9)

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in texts], **kw)

    def encode_documents(self, texts: Sequence[str], **kw) -> np.ndarray:
        return self.encode([self.document_prefix + t for t in texts], **kw)
