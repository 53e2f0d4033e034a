"""Issue 31, items 8, 15 and 16: the space loader (rpevit.sweep.yaml_strict) refuses alias bombs,
duplicate keys, non-string names, YAML 1.1 surprises, deep nesting and non-UTF-8 files with one
line naming file, key or value and what is allowed; the shipped spaces read exactly as before."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from rpevit.sweep import yaml_strict
from rpevit.sweep.space import SpaceError, load_space, parse_overrides
from rpevit.sweep.yaml_strict import MAX_ALIAS_NODES, MAX_DEPTH, StrictYAMLError
import sweep  # the CLI at the repository root (pytest puts the root on sys.path: pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]
TINY = "fixed: {dataset: digits, dim: 16, depth: 1, heads: 2, epochs: 1}\n"


def laughs(levels: int, width: int = 10, indent: str = "") -> str:
    """A 'billion laughs' list: `width`^`levels` strings once its aliases are expanded."""
    lines = [f"{indent}- &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"{indent}- &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def dry_run(tmp_path: Path, capsys, text: str | bytes, *extra: str) -> str:
    """sweep.py --dry-run on a space file; returns its one error line (exit 2 asserted)."""
    path = tmp_path / "space.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert sweep.main(["--space", str(path), "--dry-run", *extra]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "trial_key" not in out, err
    return err


def flow_laughs(levels: int, width: int = 10) -> str:
    """laughs() on one line: a `--set` value."""
    return "[" + laughs(levels, width).strip().removeprefix("- ").replace("\n- ", ", ") + "]"


BOMBS = {  # the bomb where each validated place would format or walk it
    "description": TINY + "description:\n" + laughs(9, indent="  "),
    "fixed.lr": "description:\n" + laughs(9, indent="  ") + "fixed: {dataset: digits, lr: *l8}\n",
    "grid.pe": TINY + "description:\n" + laughs(9, indent="  ") + "grid: {pe: *l8}\n",
    "include": TINY + "description:\n" + laughs(9, indent="  ") + "include: [{seed: *l8}]\n",
}


@pytest.mark.parametrize("where", [*BOMBS, "--set"])
def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path, capsys, where: str) -> None:
    """10^9 values once expanded: refused in well under a second and a few MB (it used to grow
    without bound, 5 GB in 2 minutes)."""
    text, extra = (TINY, ("--set", f"lr={flow_laughs(9)}")) if where == "--set" else (BOMBS[where], ())
    tracemalloc.start()
    t0 = time.time()
    try:
        err = dry_run(tmp_path, capsys, text, *extra)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.time() - t0 < 5 and peak < 50 * 2**20, (time.time() - t0, peak)
    assert "alias" in err and f"at most {MAX_ALIAS_NODES:,}" in err and "allowed" in err, err
    assert "--set lr" in err if where == "--set" else "space.yaml" in err


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    for text in ("a: &x [1, *x]\n", "a: &x {b: *x}\n"):
        with pytest.raises(StrictYAMLError, match="refers to its own anchor.*allowed"):
            yaml_strict.load(text)


def test_small_anchors_and_merges_of_the_shipped_spaces_still_work() -> None:
    space = load_space(ROOT / "search_spaces" / "mnist_converged_cpu.yaml")  # pe: &all_pe [...], then *all_pe
    anchored = yaml_strict.load((ROOT / "search_spaces" / "mnist_converged_cpu.yaml").read_text())
    assert {t["pe"] for t in space.trials} == set(anchored["grid"][0]["pe"]) and len(anchored["grid"][0]["pe"]) == 6
    merged = load_space(ROOT / "search_spaces" / "string_variants.yaml")  # `<<: *mnist`, `<<: *cifar10`
    assert {t["dataset"] for t in merged.trials} == {"mnist", "cifar10"}
    # below the limit is fine, however it is built
    loaded = yaml_strict.load(laughs(4))  # 10^4 + 10^3 + ... values
    assert len(loaded[3]) == 10 and loaded[3][0][0][0] == ["lol"] * 10


def test_every_shipped_space_reads_as_the_old_loader_read_it() -> None:
    """The YAML 1.2 rules change nothing the repository's spaces say (SafeLoader as the reference,
    which reads the same where a file has no 1e-3 style floats, and equal floats where it has)."""
    for path in sorted((ROOT / "search_spaces").glob("*.yaml")):
        old = yaml.load(path.read_text(), Loader=_OldLoader)
        assert yaml_strict.load(path.read_text()) == old, path


class _OldLoader(yaml.SafeLoader):
    """The loader space.py used before issue 31: SafeLoader plus 1e-3 as a float."""


_OldLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    __import__("re").compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+][0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", __import__("re").X),
    list("-+0123456789."),
)


@pytest.mark.parametrize("text, words", [
    ("grid: {pe: [ape]}\ngrid: {pe: [rope]}\n", ["duplicate key 'grid'", "line 1 and line 2",
                                                "allowed: each key once"]),
    ("fixed: {dataset: digits, epochs: 1, epochs: 2}\n", ["duplicate key 'epochs'", "allowed"]),
    ("fixed:\n  dataset: digits\n  'dataset': mnist\n", ["duplicate key 'dataset'", "line 2 and line 3"]),
])
def test_duplicate_keys_are_refused_naming_the_key(tmp_path, capsys, text: str, words: list[str]) -> None:
    err = dry_run(tmp_path, capsys, text)
    for word in words:
        assert word in err, (word, err)


def test_a_merge_may_still_be_overridden_by_the_mappings_own_keys() -> None:
    loaded = yaml_strict.load("base: &b {dataset: mnist, epochs: 2}\nrun:\n  <<: *b\n  epochs: 3\n")
    assert loaded["run"] == {"dataset": "mnist", "epochs": 3}


@pytest.mark.parametrize("value, shown", [("", "None"), ("~", "None"), ("1e3", "1000.0"), ("true", "True"),
                                          ("12", "12")])
def test_names_that_yaml_does_not_read_as_text_are_refused(tmp_path, capsys, value: str, shown: str) -> None:
    err = dry_run(tmp_path, capsys, f"name: {value}\n" + TINY)
    assert f"'name' has value {shown}; allowed: 1-100 letters" in err, err


def test_yaml_1_2_scalars() -> None:
    read = lambda text: yaml_strict.load(f"v: {text}")["v"]  # noqa: E731
    # no sexagesimal, no yes/no/on/off booleans, no leading-zero octal, no dates, no 1_000
    for text in ("1:30", "yes", "no", "on", "off", "y", "n", "Yes", "OFF", "2024-01-02", "1_000"):
        assert read(text) == text, text
    assert read("010") == 10 and read("0o17") == 15 and read("0x1f") == 31 and read("-3") == -3
    assert read("1e3") == 1000.0 and read("1.0e-3") == 1e-3 and read(".5") == 0.5 and read("-.inf") == float("-inf")
    assert read("true") is True and read("False") is False and read("~") is None and read("null") is None
    assert read(".nan") != read(".nan")
    assert parse_overrides(["epochs=1:30", "augment=no", "lr=1e-3"]) == {"epochs": "1:30", "augment": "no",
                                                                          "lr": 1e-3}
    for text, allowed in (("!!int 1:30", "an integer"), ("!!bool yes", "true or false"), ("!!float x", "a number")):
        with pytest.raises(StrictYAMLError, match=f"allowed: {allowed}"):
            read(text)
    with pytest.raises(StrictYAMLError, match="at most 4,300 digits"):  # not Python's bare ValueError
        read("9" * 5000)


def test_sexagesimal_epochs_are_a_type_error_not_90(tmp_path, capsys) -> None:
    err = dry_run(tmp_path, capsys, "fixed: {dataset: digits, epochs: 1:30}\n")
    assert "field 'epochs' has value '1:30' of type str" in err and "allowed" in err, err
    err = dry_run(tmp_path, capsys, "task: bench\nfixed: {dataset: digits}\ntiming: {warmup: yes}\n")
    assert "timing.warmup has value 'yes'; allowed: true or false" in err, err  # YAML 1.1 read `yes` as true


def test_deep_nesting_is_a_message_not_a_recursion_error(tmp_path, capsys) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    err = dry_run(tmp_path, capsys, f"description: {deep}\n" + TINY)
    assert f"nesting deeper than {MAX_DEPTH} levels" in err and "allowed" in err, err
    assert yaml_strict.load("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None  # the limit itself is fine
    with pytest.raises(SpaceError, match="nesting deeper"):
        load_space(tmp_path / "space.yaml", overrides=parse_overrides(["lr=" + "[" * 50_000]))


def test_a_file_that_is_not_utf8_text_is_named(tmp_path, capsys) -> None:
    err = dry_run(tmp_path, capsys, b"name: x\n" + bytes(range(128, 256)) + b"\n")
    assert "not UTF-8 text" in err and "space.yaml" in err and "allowed: a UTF-8 YAML space file" in err, err
    binary = Path("/bin/ls")
    if binary.exists():
        assert sweep.main(["--space", str(binary), "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "/bin/ls" in err and "allowed" in err, err
