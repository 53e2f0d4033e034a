"""rpevit/analysis/common.py: reading trials (space.json, results/STUDIES, older writers' rows) and
variant labels."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rpevit.analysis import common, efficiency, gap_closure, report
from rpevit.sweep.results import TRIALS_FILE
from rpevit.sweep.space import trial_key
from tests.analysis_rows import train_rows, write_sweep


@pytest.mark.slow
def test_stale_rows_are_set_aside_and_counted(tmp_path):
    current = train_rows()
    stale = [{**r, "seed": 7 + i, "test_acc": 0.1} for i, r in enumerate([r for r in current if r["pe"] == "rope"][:3])]
    out = write_sweep(tmp_path / "main", "main", current + stale)
    keys = [trial_key(r) for r in current]
    (out / "space.json").write_text(json.dumps({"name": "main", "source": "space.yaml", "trial_keys": keys}))
    trials = common.read_trials(out, ["train"])
    assert len(trials.frame) == len(current) and trials.set_aside == 3 and trials.frame["seed"].max() == 2
    text = gap_closure.build(out)
    assert "_3 rows set aside: not in the current space.json_" in text and "0.455 [" in text
    assert "_3 rows set aside" in efficiency.build(out)
    report_text = report.build_report(out)
    assert "| main | train | 15 | 0 | 3 |" in report_text  # status table: current rows ok, 3 set aside


def test_encoding_options_that_define_variants_label_them_apart():
    frame = pd.DataFrame({"pe": ["rope", "sparse_cayley_string", "sparse_cayley_string", "sparse_cayley_string"],
                          "string_sparsity": [0.1, 0.05, 0.1, 0.1], "cayley_solver": ["auto", "auto", "auto", "sparse"],
                          "attention": "softmax"})
    labels = list(common.pe_labels(frame))
    assert labels[0] == "rope" and len(set(labels[1:])) == 3
    assert labels[1] == "sparse_cayley_string (string_sparsity=0.05, cayley_solver=auto)"
    same_f = frame[frame["string_sparsity"] == 0.05].reset_index(drop=True)
    assert list(common.pe_labels(same_f)) == ["sparse_cayley_string"]  # nothing varies: the plain name


def test_a_combination_of_encodings_is_labelled_apart_by_the_options_of_each():
    """An audit: options were looked up by the whole `pe` name, so ape+luo_rpe rows at luo_scale 10 and 100 got
    one label and were averaged into one variant (an interval over two different configurations)."""
    frame = pd.DataFrame({"pe": ["ape+luo_rpe", "ape+luo_rpe", "luo_rpe", "ape+rope"],
                          "luo_scale": [10.0, 100.0, 10.0, 10.0], "attention": "softmax"})
    assert list(common.pe_labels(frame)) == ["ape+luo_rpe (luo_scale=10)", "ape+luo_rpe (luo_scale=100)", "luo_rpe",
                                             "ape+rope"]


def test_rows_of_an_older_writer_with_float_times_are_read_beside_timestamped_rows(tmp_path):
    """The MNIST study's pinned commit wrote started_at as float seconds, later sweeps as timestamps; read
    together they form one object column, which every time-based column must still understand."""
    parent = tmp_path / "results"
    rows = train_rows()
    new = write_sweep(parent / "new", "new", [r for r in rows if r["attention"] != "favor"])
    old = write_sweep(parent / "old", "old", [r for r in rows if r["attention"] == "favor"])
    t0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
    for folder, begin in ((new, 0), (old, 75)):  # each: one trial after another, 10 minutes apart, 9 long
        frame = pd.read_parquet(folder / TRIALS_FILE)
        assert pd.api.types.is_datetime64_any_dtype(frame["started_at"])
        start = pd.Series([t0 + pd.Timedelta(minutes=begin + 10 * i) for i in range(len(frame))],
                          dtype=frame["started_at"].dtype)
        times = {"started_at": start, "finished_at": start + pd.Timedelta(minutes=9)}
        if folder == old:
            times = {c: report.unix_seconds(v) for c, v in times.items()}
        frame.assign(**times).to_parquet(folder / TRIALS_FILE)
    both = common.load_trials(parent, "train")
    assert both["started_at"].dtype == object
    assert report.unix_seconds(both["started_at"]).notna().all()
    mixed = pd.Series([pd.Timestamp(5, unit="s", tz="UTC"), 7.5, None, pd.NaT], dtype=object)
    assert report.unix_seconds(mixed).tolist()[:2] == [5.0, 7.5] and report.unix_seconds(mixed)[2:].isna().all()
    costs = efficiency.variant_costs(both).set_index(["attention", "pe"])
    assert costs.loc[("softmax", "ape"), "timing"] == efficiency.ONE_AT_A_TIME
    assert costs.loc[("favor", "ape"), "timing"] == efficiency.CONTENDED  # old's first trial overlaps new's last
    assert "## Efficiency" in efficiency.build(parent)


def test_a_studies_line_that_is_not_a_folder_name_stops_in_one_line(tmp_path):
    write_sweep(tmp_path / "study", "study", train_rows()[:3])
    for line in ("../elsewhere", "a/b", ".hidden", "two words"):
        (tmp_path / common.STUDIES_FILE).write_text(f"study\n{line}\n")
        with pytest.raises(SystemExit) as stop:
            common.read_trials(tmp_path)
        message = str(stop.value.code)
        assert message.startswith("error: ") and "\n" not in message and "line 2" in message, message
        assert repr(line) in message and str(tmp_path / common.STUDIES_FILE) in message


# ---- a file's b"pandas" metadata renames no column (audit: a text column stored as zz_seed became `seed`)
PLANTED_SEEDS = ["[x](javascript:alert(1))", "<script>alert(1)</script>"]


def plant_pandas_rename(path, stored: str = "zz_seed", shown: str = "seed") -> None:
    """Rewrite a trials.parquet as an attacker would: its `seed` column gone, a text column `stored` holding
    PLANTED_SEEDS, and b"pandas" metadata (pandas' own JSON for this table, its `stored` entry edited) that
    names that column `shown` when the table is converted to pandas."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    table = table.drop_columns([shown]).append_column(
        stored, pa.array([PLANTED_SEEDS[i % 2] for i in range(table.num_rows)], type=pa.string()))
    meta = json.loads(pa.Table.from_pandas(table.to_pandas(), preserve_index=False).schema.metadata[b"pandas"])
    entry = next(c for c in meta["columns"] if c["field_name"] == stored)
    entry["name"] = shown
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"pandas": json.dumps(meta).encode()})
    pq.write_table(table, path)
    assert pq.read_table(path).to_pandas()[shown].tolist()[:2] == PLANTED_SEEDS  # pyarrow itself renames it


def test_pandas_metadata_in_a_results_file_renames_no_column(tmp_path):
    """check_schema checks the stored names; to_pandas renamed columns by the file's b"pandas" metadata
    afterwards, so text stored as zz_seed passed (a name no task declares) and became `seed`, which
    untrusted_names leaves as it is (declared a number): a link and a script tag reached validation_choice.md
    raw (failed before: load_trials' `seed` held them). The readers now ignore that metadata: the column
    keeps its stored name."""
    from rpevit.sweep import store
    from rpevit.sweep.results import EPOCHS_FILE

    parent = tmp_path / "results"
    folder = write_sweep(parent / "main", "main", train_rows())
    plain = write_sweep(parent / "plain", "plain", train_rows())
    plant_pandas_rename(folder / TRIALS_FILE)
    for frame in (common.load_trials(folder), common.read_trials(parent).frame, store.read_frame(folder),
                  common.read_sweep(folder / TRIALS_FILE, folder)):
        seeds = [str(v) for v in (frame["seed"] if "seed" in frame.columns else [])]
        assert not any("<" in s or "](" in s for s in seeds), seeds[:2]  # no unescaped planted text as `seed`
    rows = store.read_frame(folder)
    assert "seed" not in rows.columns and set(rows["zz_seed"]) == set(PLANTED_SEEDS)  # its stored name, as stored
    import pyarrow.parquet as pq
    assert list(rows.columns) == pq.read_schema(folder / TRIALS_FILE).names

    # ordinary rows read exactly as before: as pyarrow reads a file without pandas metadata
    for kind in (TRIALS_FILE, EPOCHS_FILE):
        if (plain / kind).exists():
            expected = pq.read_table(plain / kind).to_pandas()
            pd.testing.assert_frame_equal(store.read_frame(plain, kind), expected)
    ordinary = common.load_trials(plain)
    assert sorted(ordinary["seed"].tolist()) == sorted(r["seed"] for r in train_rows())
    assert sorted(ordinary["test_acc"].tolist()) == sorted(r["test_acc"] for r in train_rows())
    # a file pandas wrote (its own metadata, a RangeIndex, as older tests' files): the same columns and values
    pandas_written = parent / "pandas_written"
    pandas_written.mkdir()
    pd.read_parquet(plain / TRIALS_FILE).to_parquet(pandas_written / TRIALS_FILE)
    pd.testing.assert_frame_equal(store.read_frame(pandas_written), pd.read_parquet(pandas_written / TRIALS_FILE))

    # the guard after conversion: a frame whose columns are not the stored names is one error naming both
    from types import SimpleNamespace

    from rpevit.sweep.results import frame_of
    fake = SimpleNamespace(schema=SimpleNamespace(metadata=None), column_names=["zz_seed"],
                           to_pandas=lambda **_: pd.DataFrame({"seed": ["x"]}))
    with pytest.raises(common.DamagedResults, match=r"trials.parquet.*column 'zz_seed' is read as 'seed'"):
        frame_of(fake, folder / TRIALS_FILE)


def test_devices_text_names_each_device_with_its_rows_where_rows_ran_on_more_than_one():
    """A publication rehearsal: 'Device: A, B' read as one device with a comma in its name (a study resumed on
    another machine)."""
    from rpevit.analysis.common import devices_text

    # an audit: rows recorded before the CPU model was read name no model, and such rows of one study came from
    # different machines: the caption says the model was not recorded, never passes it off as one known CPU
    assert devices_text(pd.DataFrame({"device_name": ["cpu:x86_64 x1 threads"] * 3})) == \
        "device: cpu:x86_64 x1 threads (CPU model not recorded)"
    two = pd.DataFrame({"device_name": ["cpu:x86_64 Intel(R) Xeon(R) (AVX512) x1 threads"] * 2 + ["cpu:x86_64 x1 threads"]})
    assert devices_text(two) == ("2 devices: cpu:x86_64 Intel(R) Xeon(R) (AVX512) x1 threads (2 rows); "
                                 "cpu:x86_64 x1 threads (CPU model not recorded) (1 rows)")
    assert devices_text(pd.DataFrame({"device_name": ["NVIDIA H200"]})) == "device: NVIDIA H200"
    assert devices_text(pd.DataFrame({"seed": [1]})) == "device unknown"


def test_the_report_names_its_folder_the_same_in_every_clone(tmp_path, monkeypatch):
    """A publication rehearsal: the committed report began 'Results: `/work/main/results`', so every clone that
    regenerated it changed its first line."""
    from rpevit.analysis.report import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "results") == "results" and shown_path(Path("results")) == "results"
    assert shown_path(tmp_path.parent / "elsewhere") == str(tmp_path.parent / "elsewhere")
