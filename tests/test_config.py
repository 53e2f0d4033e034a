"""Bad input stops before training with one message naming field, value and what is allowed."""
from __future__ import annotations

import pytest

from rpevit.config import ConfigError, TrialConfig


@pytest.mark.parametrize("changes, words", [
    ({"dataset": "imagenet"}, ["'dataset'", "'imagenet'", "digits", "mnist", "cifar10"]),
    ({"attention": "flash"}, ["'attention'", "'flash'", "softmax"]),
    ({"pe": "alibi"}, ["'pe'", "'alibi'", "ape", "rope"]),
    ({"pe": "ape+alibi"}, ["'pe'", "'alibi'"]),
    ({"pe": "rope+rope"}, ["'pe'", "at most once"]),
    ({"epochs": -1}, ["'epochs'", "-1", "1..10000"]),
    ({"patch_size": 3}, ["'patch_size'", "3", "divisor of image_size=8"]),
    ({"pe": "rope", "dim": 24, "heads": 4}, ["'dim'", "head dim 6", "divisible by 4"]),
    ({"dim": 30, "heads": 4}, ["'dim'", "30", "multiple of heads=4"]),
    ({"device": "tpu"}, ["'device'", "'tpu'", "cpu", "cuda"]),
    ({"lr": "fast"}, ["'lr'", "'fast'", "float"]),
    ({"epochs": 2.5}, ["'epochs'", "2.5", "int"]),
    ({"image_size": 16}, ["'image_size'", "16", "digits"]),
    ({"colour": "red"}, ["unknown field", "colour", "dataset"]),
    ({"task": "finetune"}, ["'task'", "'finetune'", "train"]),
])
def test_bad_config_names_field_value_and_allowed(changes: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        TrialConfig.from_dict(changes, source="test")
    message = str(err.value)
    for word in words:
        assert word in message, (word, message)


def test_good_config_round_trips() -> None:
    cfg = TrialConfig.from_dict({"dataset": "mnist", "pe": "ape+rope", "lr": 1, "seed": 3})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.pe_names == ["ape", "rope"]
    assert cfg.grid == (4, 4) and cfg.resolved_batch_size == 64 and cfg.resolved_lr == 1.0
    default = TrialConfig.from_dict({"dataset": "mnist"})
    assert default.resolved_lr == 4e-3 and default.resolved_warmup_epochs == 0.2  # results/recipe_val_mnist
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg
