"""TRL preference-trainer arguments: mixed precision follows the device (TRL defaults to bf16,
which on a CPU without bf16 instructions runs every matmul through a scalar kernel)."""

from rl.adaptation.generator_config import GeneratorSFTConfig
from rl.adaptation.prefs import trainer_args


def test_cpu_trains_in_fp32_and_cuda_in_bf16(tmp_path):
    cpu = trainer_args(GeneratorSFTConfig.from_dict({}), tmp_path)
    assert cpu["bf16"] is False and cpu["fp16"] is False and cpu["use_cpu"] is True
    gpu = trainer_args(GeneratorSFTConfig.from_dict({"device": "cuda"}), tmp_path)
    assert gpu["bf16"] is True and gpu["use_cpu"] is False


def test_args_carry_the_prefs_settings(tmp_path):
    cfg = GeneratorSFTConfig.from_dict({"max_len": 512, "prefs": {"steps": 7, "beta": 0.3,
                                                                  "lr": 1e-4, "batch_size": 3}})
    a = trainer_args(cfg, tmp_path / "trl")
    assert (a["max_steps"], a["beta"], a["learning_rate"], a["per_device_train_batch_size"],
            a["max_length"]) == (7, 0.3, 1e-4, 3, 512)
    assert a["output_dir"] == str(tmp_path / "trl")


def test_grpo_trains_in_fp32_without_a_gpu():
    torch = __import__("torch")
    from rl.adaptation.grpo import _cuda_bf16

    assert _cuda_bf16() is (torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if not torch.cuda.is_available():
        assert _cuda_bf16() is False


def test_qlora_gradient_checkpointing_is_a_setting_on_by_default():
    import pytest

    from rag.errors import ConfigError

    assert GeneratorSFTConfig.from_yaml().qlora_gradient_checkpointing is True
    off = GeneratorSFTConfig.from_dict({"qlora_gradient_checkpointing": False})
    assert off.qlora_gradient_checkpointing is False
    with pytest.raises(ConfigError) as e:
        GeneratorSFTConfig.from_dict({"qlora_gradient_checkpointing": "sometimes"})
    assert e.value.field == "generator_sft.qlora_gradient_checkpointing"


class _WordTokenizer:
    """One token per whitespace-separated word (the real tokenizer is exercised by
    tests/test_generator_sft.py's preference runs)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def test_pairs_that_do_not_fit_max_len_are_left_out_and_counted():
    from rl.adaptation.prefs import fit_pairs

    short = {"prompt": "q " * 5, "chosen": "a b", "rejected": "c"}
    long_prompt = {"prompt": "q " * 9, "chosen": "a", "rejected": "b"}  # 9 + 1 + eot + 1 > 11
    long_answer = {"prompt": "q " * 5, "chosen": "a", "rejected": "x " * 6}
    fits, dropped = fit_pairs(_WordTokenizer(), [short, long_prompt, long_answer], 11, " <eot>")
    assert fits == [short] and dropped == 2
    # the end-of-turn marker counts: without it the 9-word prompt's pair fits exactly
    assert fit_pairs(_WordTokenizer(), [long_prompt], 11)[1] == 0
