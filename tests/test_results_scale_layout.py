"""benchmarks/results_scale.py lays out "the sweep so far" directly, as the parts a sweep of that many
trial ends (one flush each) leaves, instead of flushing 10^5 times. Its timings stand for a real
sweep only if that layout is exactly what the store's own tiered merge leaves: checked here against
rpevit.sweep.store.PartLog appending and merging flush by flush."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rpevit.sweep import store
from rpevit.sweep.results import EPOCHS_FILE, TRIALS_FILE, epochs_schema, to_table, trials_schema

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # hundreds of part writes, and the benchmark imports Ray


def benchmark_module():
    spec = importlib.util.spec_from_file_location("results_scale", REPO / "benchmarks" / "results_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def structure(folder: Path) -> dict[str, list[tuple[int, int, int]]]:
    log = store.PartLog(folder)
    return {kind: [(p.level, p.first, p.last) for p in parts] for kind, parts in log.parts.items()}


def trial(i: int) -> tuple[str, dict, dict, list[dict]]:
    key = f"{i:016x}"
    return key, {}, {"test_acc": float(i)}, [{"epoch": e, "train_loss": float(i)} for e in range(2)]


# 520 = 8^3 + 8: a level-3 part beside a level-1 one
@pytest.mark.parametrize("flushes", [1, 7, 8, 9, 63, 64, 77, 520])
def test_the_laid_out_sweep_is_the_parts_the_tiered_merge_leaves(tmp_path: Path, flushes: int) -> None:
    bench = benchmark_module()
    chosen = [trial(i) for i in range(1, flushes + 1)]
    schemas = {EPOCHS_FILE: epochs_schema("train"), TRIALS_FILE: trials_schema("train")}

    real = tmp_path / "real"
    log = store.PartLog(real)
    for sequence, one in enumerate(chosen, start=1):  # the driver: one flush per trial end
        epoch_rows, rows = bench.trial_rows([one])
        for kind, kind_rows in ((EPOCHS_FILE, epoch_rows), (TRIALS_FILE, rows)):
            log.append(kind, to_table(kind_rows, schemas[kind]), sequence)
            log.merge_tail(kind)

    laid = tmp_path / "laid"
    bench.lay_out_sweep_so_far(laid, schemas, chosen, flushes)

    assert structure(laid) == structure(real)
    for kind in (EPOCHS_FILE, TRIALS_FILE):  # and the union holds the same rows
        assert store.read_table(laid / kind).equals(store.read_table(real / kind))
