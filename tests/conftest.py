"""Shared test set-up: no network, few threads, small configs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ["RPEVIT_OFFLINE"] = "1"  # no download attempts at test time
torch.set_num_threads(min(2, torch.get_num_threads()))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
DATA_DIR = Path(os.environ.get("RPEVIT_DATA", SHARED_DATA))

TINY = {"dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 2.0, "train_subset": 200,
        "epochs": 2, "batch_size": 50, "eval_batch_size": 256, "drop_path": 0.0}


@pytest.fixture
def tiny() -> dict:
    """A digits config that trains in about a second."""
    return dict(TINY)


@pytest.fixture(autouse=True)
def _seeded_rngs() -> None:
    """Every test starts from the same global RNG state: statistical tolerances never flake."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
