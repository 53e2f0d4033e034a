"""benchmarks/relu_forms.py runs end to end (on throughput.py's tiny model) and writes what it printed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a subprocess that trains
def test_relu_forms_times_both_forms_side_by_side(tmp_path):
    out = tmp_path / "forms.json"
    result = subprocess.run([sys.executable, "benchmarks/relu_forms.py", "--model", "tiny", "--threads", "1",
                             "--rounds", "2", "--steps", "1", "--json", str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    run = json.loads(out.read_text())
    assert set(run["images_per_s"]) == {"torch.relu", "relu_as_product"}
    assert all(len(rates) == 2 and min(rates) > 0 for rates in run["images_per_s"].values())
    assert run["ratio_per_round"] == pytest.approx([p / r for p, r in zip(run["images_per_s"]["relu_as_product"],
                                                                         run["images_per_s"]["torch.relu"])])
    assert run["threshold_backward"]["transposed_ms"] > 0 and run["threshold_backward"]["contiguous_ms"] > 0
    assert "relu_as_product / torch.relu, per round:" in result.stdout
