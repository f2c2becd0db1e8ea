"""What a generator adaptation leaves behind: a merged HF folder and a registry entry.

`merge_adapter` folds a LoRA adapter into its base (a plain `format: hf` generator any part of
the stack loads); `write_registry_entry` registers that folder through
`rag.model_registry_writer` as `<name>`, `<name>@v<N>` and `<name>@best` (best = highest
valid-split answer F1 `eval_f1` of the checkpoint that was merged).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rag.errors import ConfigError
from rl.adaptation.generator_model import load_tokenizer


def merge_adapter(adapter_dir: str | Path, out_dir: str | Path,
                  base_path: str | Path | None = None) -> Path:
    """Base + LoRA merged into a plain HF folder (safetensors + tokenizer): a `format: hf`
    generator any part of the stack loads. The base comes from the adapter's meta.json."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter_dir = Path(adapter_dir)
    meta = json.loads((adapter_dir / "meta.json").read_text()) \
        if (adapter_dir / "meta.json").exists() else {}
    base = Path(base_path or meta.get("base_path") or "")
    if not (base / "config.json").exists():
        raise ConfigError("base_path", f"no base model at {base!s} for adapter {adapter_dir}")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)),
                                      str(adapter_dir))
    merged = model.merge_and_unload()
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(str(tmp))
    load_tokenizer(base).save_pretrained(str(tmp))
    (tmp / "ragpilot_meta.json").write_text(json.dumps({**meta, "adapter": str(adapter_dir)},
                                                       indent=1, default=str))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def write_registry_entry(models_yaml: str | Path, name: str, model_dir: str | Path) -> Path:
    """Register `model_dir` as a new version of generator `name` in a registry YAML
    (configs/rag/models.yaml layout; created if absent): `<name>` (this version), `<name>@v<N>`
    and `<name>@best`, which moves here only when this model's `eval_f1` (from the
    `ragpilot_meta.json` `merge_adapter` wrote) beats every earlier version's. Point
    RAGPILOT_MODELS at the file, then `generator: name` in a RAG config selects the trained
    model (tuner and bandit included). Returns the file's path."""
    from rag.model_registry_writer import register_version

    path = Path(model_dir).resolve()
    meta_file = path / "ragpilot_meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    f1 = (meta.get("eval") or {}).get("eval_f1")
    score = float(f1) if isinstance(f1, (int, float)) and not isinstance(f1, bool) else None
    register_version(models_yaml, name, "generator", "hf", path, metric="eval_f1", score=score,
                     higher_is_better=True)
    return Path(models_yaml)
