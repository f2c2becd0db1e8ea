"""The model registry maps names to local paths; YAML extensions are validated by key."""

import pytest

from rag.errors import ConfigError, ModelNotFoundError
from rag.models import ModelRegistry, ModelSpec


def test_builtin_models_resolve_to_packaged_weights():
    reg = ModelRegistry()
    enc = reg.get("minilm").resolve()
    assert (enc / "model.safetensors").exists() and (enc / "modules.json").exists()
    gguf = reg.get("smollm2-135m-instruct").resolve()
    assert gguf.suffix == ".gguf" and gguf.stat().st_size > 50_000_000


def test_unknown_model_lists_known_names():
    with pytest.raises(ModelNotFoundError, match="minilm"):
        ModelRegistry().get("bge-large")


def test_missing_path_is_a_clear_error(tmp_path):
    spec = ModelSpec("mine", "cross_encoder", "hf", path=str(tmp_path / "absent"))
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        spec.resolve()


def test_yaml_extension_overrides_and_validates(tmp_path):
    (tmp_path / "m").mkdir()
    good = tmp_path / "models.yaml"
    good.write_text(f"models:\n  my-ce:\n    kind: cross_encoder\n    format: hf\n"
                    f"    path: {tmp_path / 'm'}\n")
    reg = ModelRegistry.from_yaml(good)
    assert reg.get("my-ce").resolve() == tmp_path / "m"
    assert "minilm" in reg.names("encoder")  # built-ins kept
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  x:\n    kind: encoder\n    format: hf\n    weights: /tmp\n")
    with pytest.raises(ConfigError, match="models.x.weights"):
        ModelRegistry.from_yaml(bad)
    bad.write_text("models:\n  x:\n    format: hf\n")
    with pytest.raises(ConfigError, match="models.x.kind"):
        ModelRegistry.from_yaml(bad)
