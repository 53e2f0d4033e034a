"""rpevit/sweep/space.py, rpevit/sweep/declaration.py, sweep.py: bad spaces and flags the sweep once took
silently (or with a traceback) refused in one line naming the field, the value and what is allowed
(exit 2 from sweep.py), before anything runs."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import sweep  # the CLI at the repository root (pytest puts the root on sys.path: pyproject.toml)
from rpevit.sweep.declaration import DeclarationError, parse
from rpevit.sweep.space import SpaceError, expand_space, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
LADDER = str(ROOT / "search_spaces" / "cifar10_ladder40_cpu.yaml")  # task train, branch: epochs
BENCH = str(ROOT / "search_spaces" / "bench_mnist_cpu.yaml")  # task bench, timing:
BASE = {"fixed": {"dataset": "digits", "epochs": 1}, "grid": {"attention": ["softmax", "favor"]}}
DECLARE = {"metric": "judged", "seeds": [0, 1], "families": [
    {"name": "gap", "comparisons": [[{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}],
                                    [{"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope"}]]}]}
PAIR_APE = [{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}]
PAIR_ROPE = [{"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope"}]


def refused(capsys, argv: list[str]) -> str:
    """sweep.py's one `error:` line for argv (exit 2)."""
    assert sweep.main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "trial_key" not in out, err
    return err


def write_space(tmp_path: Path, spec: dict) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


# ---- defect 1: the task is checked before it is used as a key
@pytest.mark.parametrize("changes, where, shown", [
    ({"task": ["train"], "fuse": "seeds", "seeds": [0, 1]}, "'task'", "['train']"),
    ({"task": {"a": 1}, "timing": {"repeats": 2}}, "'task'", "{'a': 1}"),
    ({"task": ["train"], "branch": "epochs"}, "'task'", "['train']"),
    ({"task": "trian"}, "'task'", "'trian'"),
    ({"task": None}, "'task'", "None"),
    ({"fixed": {**BASE["fixed"], "task": ["train"]}, "fuse": "seeds"}, "fixed.task", "['train']"),
])
def test_a_task_that_is_not_one_task_name_is_refused_naming_the_task(changes, where, shown) -> None:
    with pytest.raises(SpaceError) as err:
        expand_space({**BASE, **changes}, source="x.yaml")
    text = str(err.value)
    assert f"x.yaml: {where} has value {shown}; allowed: one task name: " in text and "train" in text, text
    assert "is given for task" not in text


def test_a_task_that_is_not_one_task_name_is_one_line_from_sweep(tmp_path, capsys) -> None:
    path = write_space(tmp_path, {**BASE, "task": ["train"], "fuse": "seeds", "seeds": [0]})
    assert "'task' has value ['train']; allowed: one task name" in refused(capsys, ["--space", path, "--dry-run"])


# ---- defect 2: --set task would skip the task-level checks of the space
@pytest.mark.parametrize("space, task", [(LADDER, "bench"), (BENCH, "train")])
def test_set_task_is_refused(capsys, space, task) -> None:
    err = refused(capsys, ["--space", space, "--dry-run", "--set", f"task={task}"])
    assert f"--set task has value {task!r}; allowed: change task in the space file" in err


# ---- defect 3: a field given twice with different values
@pytest.mark.parametrize("flag", ["--set", "--only"])
def test_a_field_given_twice_with_different_values_is_refused(flag) -> None:
    with pytest.raises(SpaceError, match=f"{flag} epochs is given twice, with values 3 and 4; allowed: one value "
                                         f"per field"):
        parse_overrides(["epochs=3", "lr=0.1", "epochs=4"], flag=flag)
    assert parse_overrides(["epochs=3", "epochs=3"], flag=flag) == {"epochs": 3}  # the same value twice: one


def test_only_twice_for_one_field_is_one_line_from_sweep(capsys) -> None:
    err = refused(capsys, ["--space", LADDER, "--dry-run", "--only", "attention=softmax", "--only", "attention=favor"])
    assert "--only attention is given twice, with values 'softmax' and 'favor'; allowed: one value per field" in err
    err = refused(capsys, ["--space", LADDER, "--dry-run", "--set", "epochs=3", "--set", "epochs=4"])
    assert "--set epochs is given twice, with values 3 and 4" in err


# ---- defect 4: a seed beside `seeds:` was overwritten without a word
@pytest.mark.parametrize("changes, where", [
    ({"fixed": {**BASE["fixed"], "seed": 3}}, "fixed.seed has value 3"),
    ({"grid": {"attention": ["softmax"], "seed": [1, 2]}}, "grid.seed has value [1, 2]"),
    ({"grid": [{"attention": ["softmax"]}, {"attention": ["favor"], "seed": [1]}]}, "grid[1].seed has value [1]"),
    ({"sample": {"seed": {"randint": [0, 9]}}, "num_samples": 2}, "sample.seed has value"),
])
def test_a_seed_beside_the_seeds_list_is_refused(changes, where) -> None:
    with pytest.raises(SpaceError) as err:
        expand_space({**BASE, **changes, "seeds": [0]}, source="x.yaml")
    assert where in str(err.value) and "allowed: the seeds: list" in str(err.value), str(err.value)


def test_a_seed_without_the_seeds_list_is_kept() -> None:
    space = expand_space({**BASE, "grid": {"attention": ["softmax"], "seed": [1, 2]}}, source="x.yaml")
    assert [t["seed"] for t in space.trials] == [1, 2] and space.duplicates_dropped == 0
    space = expand_space({**BASE, "fixed": {**BASE["fixed"], "seed": 3}}, source="x.yaml")
    assert {t["seed"] for t in space.trials} == {3}


# ---- defect 5: declared comparisons that test nothing or count twice; an unknown family key
def family(**fam) -> dict:
    return {**DECLARE, "families": [{"name": "gap", **fam}]}


@pytest.mark.parametrize("declare, words", [
    (family(comparisons=[PAIR_APE, [PAIR_ROPE[0], PAIR_ROPE[0]]]),
     ["'declare.families[0].comparisons[1]'", "allowed: two different sides"]),
    (family(comparisons=[PAIR_APE, PAIR_ROPE, PAIR_APE]),
     ["'declare.families[0].comparisons[2]'", "repeats declare.families[0].comparisons[0]", "Holm"]),
    (family(comparisons=[PAIR_APE, PAIR_APE[::-1]]),  # b - a: the same test
     ["'declare.families[0].comparisons[1]'", "repeats declare.families[0].comparisons[0]"]),
    (family(contrasts=[[PAIR_APE, PAIR_ROPE], [PAIR_APE, PAIR_ROPE]]),
     ["'declare.families[0].contrasts[1]'", "repeats declare.families[0].contrasts[0]"]),
    (family(contrasts=[[PAIR_APE, PAIR_ROPE], [PAIR_ROPE, PAIR_APE]]),
     ["'declare.families[0].contrasts[1]'", "repeats declare.families[0].contrasts[0]"]),
])
def test_a_comparison_of_a_cell_with_itself_or_a_repeated_one_is_refused(declare, words) -> None:
    with pytest.raises(DeclarationError) as err:
        parse(declare, "x.yaml")
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_an_unknown_family_key_is_named_not_the_whole_family_dumped() -> None:
    with pytest.raises(DeclarationError) as err:
        parse(family(comparisons=[PAIR_APE], foo=1), "x.yaml")
    text = str(err.value)
    assert "unknown key declare.families[0].foo" in text and "allowed: name, for_each" in text, text
    assert "softmax" not in text and len(text) < 200, text
    with pytest.raises(DeclarationError, match="did you mean 'comparisons'"):
        parse(family(comparisons=[PAIR_APE], comparison=[PAIR_ROPE]), "x.yaml")


def test_the_space_files_declared_self_comparison_is_one_line(tmp_path, capsys) -> None:
    spec = yaml.safe_load(Path(LADDER).read_text())
    spec["declare"]["families"][0]["comparisons"][0] = [{"attention": "softmax", "pe": "ape"}] * 2
    err = refused(capsys, ["--space", write_space(tmp_path, spec), "--dry-run"])
    assert "'declare.families[0].comparisons[0]'" in err and "two different sides" in err


# ---- defect 6: flags that did nothing, and an empty --results-dir
def test_flags_that_would_do_nothing_are_refused(tmp_path, capsys) -> None:
    smoke = str(ROOT / "search_spaces" / "smoke.yaml")
    err = refused(capsys, ["--space", smoke, "--dry-run", "--retry-failed", "--results-dir", str(tmp_path)])
    assert "--retry-failed is given without --resume; allowed: only with --resume" in err
    err = refused(capsys, ["--space", smoke, "--dry-run", "--redeclare", "--results-dir", str(tmp_path)])
    assert "--redeclare is given but" in err and "has no declare: block; allowed: only for a space with" in err
    err = refused(capsys, ["--space", smoke, "--dry-run", "--results-dir", ""])
    assert "--results-dir has value ''; allowed: a folder" in err
