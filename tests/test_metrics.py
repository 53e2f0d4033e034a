"""Metric formulas against scikit-learn and hand computations; the device a row names."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, log_loss, precision_recall_fscore_support

from rpevit.metrics import classification_metrics, confusion_matrix, cpu_model, device_name, information_criteria


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_sklearn(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(300, 7, generator=g) * 2
    y = torch.randint(0, 6, (300,), generator=g)  # class 6 never true: tests the label set
    got = classification_metrics(logits, y)
    pred = logits.argmax(-1).numpy()
    p, r, f, _ = precision_recall_fscore_support(y.numpy(), pred, average="macro", zero_division=0)
    assert got["test_acc"] == pytest.approx(accuracy_score(y.numpy(), pred))
    assert got["precision"] == pytest.approx(p)
    assert got["recall"] == pytest.approx(r)
    assert got["f1"] == pytest.approx(f)
    probs = torch.softmax(logits.double(), -1).numpy()
    expected_ll = -log_loss(y.numpy(), probs, labels=list(range(7)), normalize=False)
    assert got["log_likelihood"] == pytest.approx(expected_ll, rel=1e-9)


def test_confusion_matrix_by_hand() -> None:
    cm = confusion_matrix(torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 0]), 3)
    assert cm.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 0]]


def test_information_criteria_by_hand() -> None:
    got = information_criteria(log_likelihood=-120.5, params=10, n=50)
    assert got["aic"] == pytest.approx(2 * 10 + 241.0)
    assert got["bic"] == pytest.approx(10 * math.log(50) + 241.0)


def test_perfect_predictions() -> None:
    y = torch.arange(10) % 3
    logits = torch.nn.functional.one_hot(y, 3).float() * 50
    got = classification_metrics(logits, y)
    assert got["test_acc"] == got["precision"] == got["recall"] == got["f1"] == 1.0
    assert got["log_likelihood"] == pytest.approx(0.0, abs=1e-9)
    assert np.isfinite(got["log_likelihood"])


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC   9B45 128-Core Processor
flags\t\t: fpu avx2

processor\t: 1
model name\t: AMD EPYC 9B45 128-Core Processor
"""


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path) -> None:
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    assert cpu_model(tmp_path / "cpuinfo") == "AMD EPYC 9B45 128-Core Processor"  # the first, spaces collapsed
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")
    assert cpu_model(tmp_path / "arm") == ""  # no model line: nothing invented
    assert cpu_model(tmp_path / "absent") == ""


def test_a_cpu_row_names_the_model_and_vector_unit_that_timed_it() -> None:
    name = device_name(torch.device("cpu"))
    assert name.startswith("cpu:") and name.endswith(f"x{torch.get_num_threads()} threads")
    capability = torch.backends.cpu.get_cpu_capability()
    assert f"({capability})" in name
    model = cpu_model(Path("/proc/cpuinfo"))
    if model:  # Linux on x86: the model the kernel reports, as it reports it
        assert model in name
