"""What a GPU lease brought back, as one Markdown page: the device, each GPU test run's counts (and
what failed), each throughput benchmark's rows, and the issue-40 goals beside what was measured.

    python benchmarks/lease/summary.py results/gpu_h200/lease_2026-11-26

Reads the folder's `*pytest*.xml` (JUnit, as `pytest --junitxml` writes it), beside each its `.collected`
(the test ids `pytest --collect-only -q` listed before the run: benchmarks/gpu_lease.sh), and
`*throughput*.json` (benchmarks/throughput.py --json), and writes SUMMARY.md beside them, so every figure
quoted about a lease is generated from the files it returned, never typed. A run cut at its time limit
writes an XML of the tests that ran, whose counts alone read as green: the page says "N of M collected
ran; cut at the time limit" and names the ones that did not. A benchmark mode that failed is a row
saying so, with its error; the rest of the page is still written. The files came back from another machine,
so they are untrusted: read only when a regular file under MAX_BYTES, XML parsed by the stdlib's expat
(no external entities; expat bounds entity amplification), every text made inert for Markdown, and
the page written through the one no-follow atomic writer.
"""
from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rpevit.analysis.common import md_text  # noqa: E402
from rpevit.config import ConfigError  # noqa: E402
from rpevit.sweep.results import atomic_file, named_folder, read_regular_bytes  # noqa: E402

MAX_BYTES = 8 * 2**20
# Issue 40's goals (stated for an H100): one compiled trial of the GPU protocol model, and the
# aggregate with fused groups; the 200-epoch, 5-seed all12 CIFAR-10 half under one GPU-hour.
GOAL_SOLO_COMPILED = 20_000.0
GOAL_AGGREGATE = 100_000.0
GOAL_ALL12_HOURS = 1.0
# Issue 60's (the same device and model): one fused group, and the aggregate, of the CIFAR-10 GPU protocol.
GOAL_ONE_GROUP_60 = 80_000.0
GOAL_AGGREGATE_60 = 150_000.0


def goal_row(issue: str, goal: str, wanted: float, measured: float) -> str:
    """One goal beside its best measured figure; 'not measured' where no mode of that kind ran."""
    if measured <= 0:
        return f"| {issue} | {goal} | >= {_fmt(wanted)} | not measured | - |"
    return f"| {issue} | {goal} | >= {_fmt(wanted)} | {_fmt(measured)} | {'yes' if measured >= wanted else 'no'} |"
COLLECTED_SUFFIX = ".collected"  # beside X.xml: X.collected, the ids `pytest --collect-only -q` listed
MAX_LISTED = 10  # tests not run named on the page, at most


READ_ALLOWED = f"a regular file of at most {MAX_BYTES:,} bytes, as the lease wrote it"


def _read(path: Path) -> bytes:
    """A returned file's bytes through results.read_regular_bytes: opened without following a link and without
    blocking (a FIFO, a device, a folder or a link is refused, never waited on or read through), checked on the
    open file, at most MAX_BYTES; otherwise SystemExit, one line naming the file, what it is and what is allowed."""
    try:
        data = read_regular_bytes(path, MAX_BYTES, READ_ALLOWED)
    except ConfigError as err:  # names the file, what it is and READ_ALLOWED
        raise SystemExit(f"lease summary: {' '.join(str(err).split())}") from None
    except OSError as err:
        raise SystemExit(f"lease summary: {path} cannot be read ({err.strerror or err}); allowed: "
                         f"{READ_ALLOWED}") from None
    if data is None:  # gone since the folder was listed
        raise SystemExit(f"lease summary: {path} is gone; allowed: {READ_ALLOWED}")
    return data


def test_counts(path: Path) -> dict[str, Any]:
    """passed / failed / errors / skipped, the failing test names and every test's name of one JUnit file."""
    root = ET.fromstring(_read(path))
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    every = [case for suite in suites for case in suite.iter("testcase")]
    # A run stopped by its time limit (SIGINT) can leave <testcase/> entries without a name: tests that were
    # scheduled and never reported. They are not passes; they are counted apart ("unnamed").
    cases = [case for case in every if case.get("name")]
    failed = [c for c in cases if c.find("failure") is not None]
    errors = [c for c in cases if c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    seconds = sum(float(s.get("time", 0) or 0) for s in suites)
    return {"tests": len(cases), "failed": [c.get("name", "?") for c in failed],
            "errors": [c.get("name", "?") for c in errors], "skipped": len(skipped),
            # a case is one outcome: a failed test whose teardown also errs has both elements, and counts once
            "passed": sum(all(c.find(tag) is None for tag in ("failure", "error", "skipped")) for c in cases),
            "seconds": seconds,
            "names": {c.get("name", "?") for c in cases}, "unnamed": len(every) - len(cases)}


def collected_ids(path: Path) -> list[str] | None:
    """The test ids collected before the run of `path` (its `.collected` beside it), or None: not recorded."""
    listing = path.with_suffix(COLLECTED_SUFFIX)
    if not listing.exists() and not listing.is_symlink():
        return None
    text = _read(listing).decode("utf-8", errors="replace")
    return [line.strip() for line in text.splitlines() if "::" in line]


def ran_line(name: str, ran: set[str] | None, collected: list[str]) -> str:
    """One plain sentence: how many of the collected tests ran (`ran`: the XML's test names; None: no XML
    came back), and which did not."""
    if ran is None:
        return (f"- {md_text(name)}: 0 of {len(collected)} collected ran: no XML came back (the run was stopped "
                f"before pytest wrote it)")
    missing = [test for test in collected if test.rsplit("::", 1)[-1] not in ran]
    done = len(collected) - len(missing)
    if not missing:
        return f"- {md_text(name)}: {done} of {len(collected)} collected ran."
    shown = ", ".join(md_text(test.rsplit("::", 1)[-1]) for test in missing[:MAX_LISTED])
    more = f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
    return f"- {md_text(name)}: {done} of {len(collected)} collected ran; cut at the time limit. Not run: {shown}{more}."


def cell(value: Any) -> str:
    """Text from a returned file as one inert table cell: md_text, and `|` escaped (it would split the cell)."""
    return md_text(value).replace("|", "\\|")


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def timed(row: Any) -> bool:
    """A mode that measured: a rate and the figures printed beside it (a failed mode has an error instead)."""
    return isinstance(row, dict) and all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                                         for k in ("images_per_s", "step_ms", "tflops", "utilisation"))


def _base(rows: list) -> tuple[float | None, str]:
    """The rate the ratios divide by: solo eager's, else the file's first measured mode's (the short lease
    runs a fused group first), and the mode's name where it is not solo eager."""
    measured = [r for r in rows if timed(r)]
    base = next((r for r in measured if r.get("mode") == "solo eager"), measured[0] if measured else None)
    if base is None or base["images_per_s"] <= 0:
        return None, ""
    return base["images_per_s"], "" if base.get("mode") == "solo eager" else f" of {cell(base.get('mode', '?'))}"


def _mode_row(name: str, model: str, row: dict, base: float | None, of: str) -> str:
    """One mode as a table row: its figures, or that it failed and why."""
    mode = cell(row.get("mode", "?")) if isinstance(row, dict) else "?"
    if not timed(row):
        error = cell(row.get("error", "no rate recorded")) if isinstance(row, dict) else "not a row"
        return f"| {cell(name)} | {cell(model)} | {mode} | failed: {error} | - | - | - | - | - |"
    samples = [x for x in row.get("images_per_s_samples") or [] if isinstance(x, (int, float))] or [row["images_per_s"]]
    ratio = f"{row['images_per_s'] / base:.2f}x{of}" if base else "-"
    return (f"| {cell(name)} | {cell(model)} | {mode} | "
            f"{_fmt(row['images_per_s'])} ({_fmt(min(samples))}-{_fmt(max(samples))}, n={len(samples)}) | "
            f"{row['step_ms']:.1f} | {row['tflops']:.2f} | {100 * row['utilisation']:.2f}% | {ratio} | "
            f"{cell(row.get('compile_fallback') or '-')} |")


def throughput_rows(path: Path) -> tuple[str, list[str], list[str], dict[str, float], bool]:
    """The device, the Markdown rows (a failed mode: a row saying so) and profiles of one benchmark file, the
    best figures per goal, and whether a ratio is to another mode than solo eager."""
    data = json.loads(_read(path))
    device = md_text(data.get("device", "unknown device"))
    lines, profiles, best = [], [], {"solo_compiled": 0.0, "one_group": 0.0, "aggregate": 0.0, "hours": float("inf")}
    other_base = False
    for model, result in data.get("models", {}).items():
        rows = result.get("rows") or []
        base, of = _base(rows)
        other_base |= bool(of)
        for row in rows:
            lines.append(_mode_row(path.name, model, row, base, of))
            if not timed(row):
                continue
            if isinstance(row.get("profile"), dict):
                profiles.append(_profile_row(path.name, model, row.get("mode", "?"), row["profile"]))
            if str(row.get("mode", "")).startswith("solo compiled"):
                best["solo_compiled"] = max(best["solo_compiled"], row["images_per_s"])
            if str(row.get("mode", "")).startswith("fused"):  # one process, one group
                best["one_group"] = max(best["one_group"], row["images_per_s"])
            best["aggregate"] = max(best["aggregate"], row["images_per_s"])
        if isinstance(result.get("projected_all12_cifar10_hours"), (int, float)):
            best["hours"] = min(best["hours"], float(result["projected_all12_cifar10_hours"]))
    return device, lines, profiles, best, other_base


def conditions_text(path: Path) -> str:
    """What else ran beside one benchmark file's run, as it recorded (benchmarks/throughput.py run_conditions, at
    its start and end): '`x.json`: alone on the GPU (no other compute process listed by nvidia-smi at start or
    end); 1-min load average 1.02 then 3.9 on 16 CPUs', 'contended: ...', or that the file records none."""
    data = json.loads(_read(path))
    conditions = data.get("conditions") if isinstance(data, dict) else None
    name = f"`{cell(path.name)}`"
    if not isinstance(conditions, dict) or not all(isinstance(conditions.get(k), dict) for k in ("start", "end")):
        return f"{name}: conditions not recorded (alone or contended unknown: a file written before 2026-11-30)"
    start, end = conditions["start"], conditions["end"]

    def number(entry: dict, key: str) -> float | None:
        value = entry.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    others = [number(e, "other_gpu_processes") for e in (start, end)]
    if None in others:
        gpu = "other GPU processes not listed (no nvidia-smi, or not a GPU run)"
    elif sum(others) == 0:
        gpu = "alone on the GPU (no other compute process listed by nvidia-smi at start or end)"
    else:
        gpu = (f"contended on the GPU: {int(others[0])} other compute process(es) at start, {int(others[1])} at end "
               f"(nvidia-smi)")
    loads, cpus = [number(e, "load_avg_1min") for e in (start, end)], number(start, "cpus")
    load = ("; 1-min load average " + " then ".join("?" if v is None else f"{v:.2f}" for v in loads)
            + (f" on {int(cpus)} CPUs" if cpus else ""))
    return f"{name}: {gpu}{load}"


def _profile_row(name: str, model: str, mode: str, p: dict) -> str:
    """One mode's step profile (benchmarks/step_profile.py) as a table row."""
    if "device_busy_fraction" not in p:
        busy = "-"
    elif "device_busy_from" not in p:  # step_profile.py before the fix: every CPU op's kernels counted twice
        busy = "not shown: counted twice"
    elif p["device_busy_fraction"] > 1.0:  # kernels on several streams, or a graph's, overlap: no busy fraction
        busy = f"not shown: device events overlap ({100 * p['device_busy_fraction']:.0f}% of wall)"
    else:
        busy = f"{100 * p['device_busy_fraction']:.0f}%"
    regions = "; ".join(f"{cell(k)} {v:.2f}" for k, v in p.get("region_cpu_ms_per_step", {}).items()) or "-"
    return (f"| {cell(name)} | {cell(model)} | {cell(mode)} | {p['wall_ms_per_step']:.2f} | {busy} | "
            f"{p['launches_per_step']:.0f} | {p['syncs_per_step']:.1f} | {regions} |")


def summary(folder: Path) -> str:
    xmls = sorted(p for p in folder.glob("*pytest*.xml"))
    benches = sorted(p for p in folder.glob("*throughput*.json"))
    unrun = sorted(p.with_suffix(".xml") for p in folder.glob(f"*pytest*{COLLECTED_SUFFIX}")
                   if not os.path.lexists(p.with_suffix(".xml")))  # collected, and no XML came back
    if not xmls and not benches and not unrun:
        raise SystemExit(f"lease summary: {folder} holds no *pytest*.xml or *throughput*.json; allowed: a folder "
                         f"a lease's files were committed to")
    out = [f"# GPU lease: {md_text(folder.name)}", "",
           "_Generated by `python benchmarks/lease/summary.py` from the files beside it; do not edit._", ""]
    devices, rows, profiles, other_base = set(), [], [], False
    best = {"solo_compiled": 0.0, "one_group": 0.0, "aggregate": 0.0, "hours": float("inf")}
    for path in benches:
        device, lines, profiled, b, other = throughput_rows(path)
        devices.add(device)
        rows += lines
        profiles += profiled
        other_base |= other
        best = {**{k: max(best[k], b[k]) for k in ("solo_compiled", "one_group", "aggregate")},
                "hours": min(best["hours"], b["hours"])}
    out += [f"Device: {', '.join(sorted(devices)) or 'not recorded by a benchmark file'}", ""]
    if benches:  # alone or contended, as each benchmark file recorded what ran beside it
        out += ["Conditions: " + "; ".join(conditions_text(path) for path in benches) + ".", ""]
    if xmls or unrun:
        out += ["## GPU tests (`pytest -m gpu`: tests/test_gpu.py and, from 2026-11-27, tests/test_gpu_whole_step.py)", ""]
        ran = []
        if xmls:
            out += ["| file | tests | passed | failed | errors | skipped | seconds | failing |",
                    "|---|---|---|---|---|---|---|---|"]
        for path in xmls:
            c = test_counts(path)
            failing = ", ".join(cell(n) for n in dict.fromkeys(c["failed"] + c["errors"])) or "-"  # each test once
            out.append(f"| {cell(path.name)} | {c['tests']} | {c['passed']} | {len(c['failed'])} | {len(c['errors'])} | "
                       f"{c['skipped']} | {c['seconds']:.0f} | {failing} |")
            if c["unnamed"]:
                ran.append(f"- {md_text(path.name)}: {c['unnamed']} more test entries without a name (stopped before "
                           f"they reported): not counted as run.")
            collected = collected_ids(path)
            if collected is not None:
                ran.append(ran_line(path.name, c["names"], collected))
        ran += [ran_line(path.name, None, collected_ids(path) or []) for path in unrun]
        out += ["", "Of the tests collected before each run (`pytest --collect-only`):", "", *ran] if ran else []
        out.append("")
    if rows:
        out += ["## Throughput (`benchmarks/throughput.py`; median images/s of the samples, min-max, n samples)", "",
                "| file | model | mode | images/s | ms/step | TFLOP/s | of peak | vs solo eager | compile fallback |",
                "|---|---|---|---|---|---|---|---|---|", *rows, "",
                *(["Where a file has no solo eager row, its ratios are to the mode the cell names (its first "
                   "measured mode: the short lease's one-process baseline).", ""] if other_base else []),
                "## The goals (stated for an H100) beside the best measured", "",
                "| issue | goal | wanted | measured | met |", "|---|---|---|---|---|",
                goal_row("40", "one compiled trial, images/s", GOAL_SOLO_COMPILED, best["solo_compiled"]),
                goal_row("40", "aggregate with fused groups, images/s", GOAL_AGGREGATE, best["aggregate"]),
                goal_row("60", "one fused group, images/s", GOAL_ONE_GROUP_60, best["one_group"]),
                goal_row("60", "aggregate, images/s", GOAL_AGGREGATE_60, best["aggregate"])]
        if best["hours"] < float("inf"):
            out.append(f"| 40, 60 | all12 CIFAR-10 half, 200 epochs (projected), GPU-hours | <= {GOAL_ALL12_HOURS:g} | "
                       f"{best['hours']:.2f} | {'yes' if best['hours'] <= GOAL_ALL12_HOURS else 'no'} |")
        out.append("")
    if profiles:
        out += ["## Where a step's time goes (`--profile-steps`; per step, under the profiler)", "",
                "| file | model | mode | wall ms | device busy | launches | host syncs | CPU ms by region |",
                "|---|---|---|---|---|---|---|---|", *profiles, ""]
        if any("not shown: counted twice" in row for row in profiles):
            out += ["Device busy is not shown for files written before `device_busy_from` existed: that "
                    "step_profile.py summed the device time of every event but the launch calls, so each kernel "
                    "counted once as a device event and once under the op that launched it.", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/lease/summary.py LEASE_FOLDER", file=sys.stderr)
        return 2
    folder = named_folder(argv[0])
    if not folder.is_dir():
        print(f"lease summary: {folder} is not a folder; allowed: a folder holding a lease's files", file=sys.stderr)
        return 2
    text = summary(folder)
    with atomic_file(folder / "SUMMARY.md") as f:
        f.write(text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    from rpevit.tool_exit import run_tool  # the teardown can abort (rpevit/tool_exit.py)

    run_tool(lambda: main(sys.argv[1:]))
