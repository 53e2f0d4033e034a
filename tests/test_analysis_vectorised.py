"""The analysis computed per distinct value instead of per row (issue 42) gives what the plain per-row
computation gives: keys of a configuration's seeds, resolved frames, random-feature flags, labels, and
overlapping trial intervals. Each plain computation is written out here as the reference."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rpevit.analysis import common, efficiency
from rpevit.config import TrialConfig, field_types
from rpevit.sweep import migrate
from rpevit.sweep.results import STORED_KEY
from rpevit.sweep.space import trial_key, seeded_keys


def test_seeded_keys_equal_trial_key_of_each_seed():
    configs = [TrialConfig().to_dict(), TrialConfig.from_dict({"attention": "favor", "pe": "rope", "lr": 3e-4}).to_dict(),
               TrialConfig.from_dict({"dataset": "cifar10", "pe": "luo_rpe", "luo_scale": 10.0}).to_dict()]
    seeds = [TrialConfig.seed, 0, 1, 7, 2**62, TrialConfig.seed + 1]
    for config in configs:
        assert seeded_keys(config, seeds) == [trial_key({**config, "seed": s}) for s in seeds]


def plain_resolved_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """resolved_frame as it was before issue 42: resolved_row on every row (rpevit/sweep/migrate.py at 272a0fa)."""
    resolved = [migrate.resolved_row(r) for r in frame.to_dict("records")]
    out = frame.copy()
    for name in ("trial_key", *(n for n in field_types() if n in frame.columns)):
        values = pd.Series([r.get(name) for r in resolved], index=frame.index)
        try:
            out[name] = values.astype(frame[name].dtype)
        except (TypeError, ValueError):
            out[name] = values
    out[STORED_KEY] = frame["trial_key"].to_numpy()
    statuses = frame["status"].tolist() if "status" in frame.columns else [None] * len(frame)
    kept = set(migrate.preferred_rows(out["trial_key"].tolist(), statuses).values())
    return out[[i in kept for i in range(len(out))]]


def stored_rows() -> pd.DataFrame:
    """Rows as older sweeps stored them: placeholders (batch_size 0, lr 0, augment auto), several seeds
    of each configuration, a missing seed, two spellings of one computation (one failed)."""
    rows = []
    for attention, pe, batch in (("softmax", "ape", 0), ("favor", "rope", 128), ("relu", "luo_rpe", 0)):
        for seed in (5, 6, 7, None):  # None: the default seed
            row = {**TrialConfig.from_dict({"attention": attention, "pe": pe, "dataset": "mnist"}).to_dict(),
                   "batch_size": batch, "lr": 0.0, "augment": "auto", "status": "ok"}
            row["seed"] = seed if seed is not None else math.nan
            row["trial_key"] = f"{len(rows) + 1:016x}"
            rows.append(row)
    resolved_batch = migrate.resolved_config(rows[0])["batch_size"]  # the same computation, spelled out
    twin = {**rows[0], "batch_size": resolved_batch, "trial_key": f"{len(rows) + 1:016x}", "status": "failed"}
    return pd.DataFrame(rows + [twin])


def test_resolved_frame_equals_resolving_row_by_row(capsys):
    frame = stored_rows()
    got = migrate.resolved_frame(frame)
    expected = plain_resolved_frame(frame)
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == len(frame) - 1 and "repeat the resolved config" in capsys.readouterr().err
    assert set(got["batch_size"]) != {0}  # placeholders resolved


def test_has_random_features_equals_asking_the_backend_per_row():
    rows = []
    for attention in ("softmax", "favor", "relu", "no_such_backend", None):
        for projection in ("random", "identity", None):
            rows.append({"attention": attention, "relu_projection": projection, "seed": len(rows)})
    frame = pd.DataFrame(rows)
    plain = []
    for row in frame.to_dict("records"):
        cls = common.attention_class(row.get("attention"))
        plain.append(bool(cls is not None and cls.draws_random_features(row)))
    assert common.has_random_features(frame).tolist() == plain
    assert sum(plain) >= 3  # favor (any projection) and relu with a random one draw


def test_per_distinct_equals_calling_per_row():
    values = [None, math.nan, 1, 1.0, True, "1", None, math.nan, 2, 1]
    column = pd.Series(values, dtype=object)
    other = pd.Series([0.5, 0.5, np.nan, np.nan, 0.5, 0.5, 0.5, np.nan, 0.5, 0.5])
    calls = []

    def fn(a, b):
        calls.append((a, b))
        return f"{type(a).__name__}:{a!r}|{b!r}"

    assert common.per_distinct([column, other], fn) == [fn(a, b) for a, b in zip(values, other)]
    assert common.per_distinct([], fn) == []


def test_redraw_labels_equal_redraw_label_per_row():
    frame = pd.DataFrame({"redraw_interval": [0, 100, 100, None, 5, 100],
                          "redraw_until": [None, 0.8, None, 0.5, math.inf, 0.8]})
    random = pd.Series([True, True, False, True, True, True])
    interval = pd.to_numeric(frame["redraw_interval"], errors="coerce")
    until = pd.to_numeric(frame["redraw_until"], errors="coerce")
    assert common.redraw_labels(frame, random) == [common.redraw_label(r, i, u)
                                                   for r, i, u in zip(random, interval, until)]


@pytest.mark.parametrize("seed", range(5))
def test_overlaps_equal_counting_every_pair(seed):
    rng = np.random.default_rng(seed)
    n = 300
    start = np.round(rng.uniform(0, 100, n))  # whole numbers: ties between starts and ends
    end = start + np.round(rng.uniform(1, 20, n))
    plain = ((start[:, None] < end[None, :]) & (start[None, :] < end[:, None])).sum(axis=1)
    assert efficiency.overlaps(start, end).tolist() == plain.tolist()
    end[::7] = start[::7]  # empty intervals: the pairwise path
    plain = ((start[:, None] < end[None, :]) & (start[None, :] < end[:, None])).sum(axis=1)
    assert efficiency.overlaps(start, end).tolist() == plain.tolist()


def test_one_read_per_folder_reads_each_folder_once(tmp_path, monkeypatch):
    from tests.analysis_rows import train_rows, write_sweep

    out = write_sweep(tmp_path / "s", "s", train_rows())
    reads = []
    real = common.store.read_table
    monkeypatch.setattr(common.store, "read_table", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    with common.one_read_per_folder():
        first = common.read_sweep(out / "trials.parquet", out)
        first["pe"] = "edited"  # a section's edit stays its own
        second = common.read_sweep(out / "trials.parquet", out)
    assert len(reads) == 1 and (second["pe"] != "edited").all()
    common.read_sweep(out / "trials.parquet", out)
    assert len(reads) == 2  # outside: read again (a report sees the rows as they are when it runs)
