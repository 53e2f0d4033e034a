"""`sweep.py --deadline`: run only what fits before a GPU lease or a cluster job's time limit ends.

The runner decides before Tuner.fit() which Tune trials (a trial, a fused group of seeds, an
interleaved timing run) it starts, from estimates of how long each takes, and never starts one
predicted to end after the deadline; the others stay pending for a later `--resume`. Trials it
started are not stopped at the deadline: they were predicted to fit. If a prediction was wrong and
the job's scheduler kills the driver, the per-epoch checkpoints keep the progress and `--resume`
continues from them.

The value (`parse_deadline`): a wall-clock time, ISO 8601 (`2026-11-23T18:00`, with an optional
UTC offset such as `+01:00` or `Z`; without one it is the driver machine's local time, from `TZ`)
or `HH:MM` (today, local time); or a duration from the driver's start: minutes (`90m`, `90`) or
hours (`1.5h`). Past times, zero or negative durations, anything more than a year ahead (a time or a
duration) and anything else are refused, naming --deadline, the value and what is allowed, before
Ray starts.

Estimates (`Estimator`), per Tune trial, from the OK rows of trials.parquet in the sweep folder
(every row of the task, those an edited YAML set aside included: they are measurements), at the
first level that has rows: the same recipe (every field equal but seed and epochs), the same model
(the data, model, attention and pe sections equal), any row of the task. A row's time is the seconds
from started_at to finished_at, over the epochs that run trained (epochs_done - resumed_from_epoch);
a trial that needs n epochs (its epochs minus those its `trials/<key>/checkpoint.pt` holds, read
through rpevit.checkpoint, weights only) is estimated as the larger of two readings of that row, d *
n / m and d - (m - n) * train_s_per_epoch: the first scales everything by the epochs, the second
keeps the row's fixed cost (data loading, validation, the final evaluation) whole, so both a longer
and a resumed trial are over- rather than under-estimated. Of several rows at a level the slowest
counts, among those that trained at least the n epochs asked for where there are any: a row of a few
epochs scaled up by d * n / m counts its fixed cost n / m times (a budget ladder's 2-epoch cool-down
row, scaled to a 40-epoch trunk, counted its start-up and final evaluation 20 times). A budget
ladder's shorter trial is planned as its cool-down alone when its trunk runs before it in the plan
and has passed the branch epoch by the time its slot frees (`branch_estimate`), else as the whole
run it then trains. Tasks without epochs (bench, kernel_mse) take a row's time as it is. The members
of a fused group run together, so the group takes one member's time, scaled by k_new / k_row when
the group has more members than the row's group had (k members cost k times the work on a CPU; about
the same on a GPU once rows of groups of that size exist); members whose checkpoints stand at
different epochs train as sub-groups one after another, whose times add up.

Nothing known (no OK row of the task yet): with `--deadline-estimate SECONDS` (per epoch of one
Tune trial; per trial for tasks without epochs; at most a year) everything is planned from it.
Without it the runner starts exactly one Tune trial, the first pending one, as a probe (nothing can
be promised about it: it risks one trial's work, which its checkpoints keep), then plans the rest of
the sweep from the probe's measured row, in the same run. If the probe leaves no OK row, nothing
more is started; if the deadline leaves no time even for a probe's start-up, nothing starts.

The plan (`plan_units`): Tune trials in space order on `slots` (how many run at once), each
started on the first slot to free up, as Tune hands them out; a trial is admitted when it ends
before the deadline, counting STARTUP_S before the first trials start (Tune, the workers' imports)
and PER_TRIAL_S before each; one that does not fit is left, and later (shorter) ones may still
fit. The runner plans in rounds (rpevit.sweep.launch_plan.plan_deadline_round, run by
rpevit.sweep.tune_run.run_before_deadline): the admitted trials
run, and when they have finished, what was left is planned again from the time actually left, the
rows they added and the start-up they measured (their first start after Tuner.fit() began), so
time the estimates overstated is used. When even unlimited slots would admit nothing, Ray is not
started at all.
"""
from __future__ import annotations

import datetime as dt
import heapq
import math
import re
import shlex
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from rpevit.config import ConfigError, TrialConfig, section_fields
from rpevit.sweep.results import TRIALS_FILE, task_metrics, trial_folder
from rpevit.sweep.store import read_rows

STARTUP_S = 60.0  # from the plan to the first trials running: Tune, workers importing torch, warm-up trials
PER_TRIAL_S = 5.0  # before each trial on a slot (measured: 0.3 s with reused workers, 5 s without)
MAX_MINUTES = 366 * 24 * 60  # a duration beyond a year is a typo
NEW_DEADLINE = "WHEN"  # placeholder of the printed resume command
LEVELS = ("same recipe", "same model", "same task")  # where an estimate came from, best first
FALLBACK = "--deadline-estimate"
UNMATCHED_FIELDS = ("seed", "epochs", "data_dir")  # what may differ at level "same recipe"
MODEL_SECTIONS = ("data", "model", "attention", "pe")  # what must agree at level "same model"


def _local_zone() -> str:
    now = dt.datetime.now().astimezone()
    return f"{now.tzname()}, UTC{now.strftime('%z')[:3]}:{now.strftime('%z')[3:]}"


def allowed_text() -> str:
    return (f"a future wall-clock time, ISO 8601 (2026-11-23T18:00; with a UTC offset such as +01:00 or Z, else "
            f"local time: {_local_zone()}) or HH:MM (today, local time); or a duration from now: minutes > 0 "
            f"(90m or 90) or hours (1.5h), at most a year")


@dataclass(frozen=True)
class Deadline:
    """When the sweep must be done: a Unix time, and the --deadline text it came from."""

    at: float
    text: str = ""

    def describe(self, now: float | None = None) -> str:
        """'2026-11-23 18:00:00 CET (UTC+01:00), in 1 h 30 min'."""
        now = time.time() if now is None else now
        local = dt.datetime.fromtimestamp(self.at).astimezone()
        offset = local.strftime("%z")
        return (f"{local.strftime('%Y-%m-%d %H:%M:%S')} {local.tzname()} (UTC{offset[:3]}:{offset[3:]}), "
                f"{'in ' + span(self.at - now) if self.at > now else 'passed ' + span(now - self.at) + ' ago'}")


def span(seconds: float) -> str:
    """A duration in words: '1 h 05 min', '4 min 10 s', '12 s'; 'more than a year' beyond MAX_MINUTES
    (a day count of 300 digits says nothing more)."""
    seconds = max(0.0, seconds)
    if not seconds <= MAX_MINUTES * 60:  # NaN and inf too
        return "more than a year"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    if minutes < 48 * 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    return f"{minutes // 1440} d {minutes % 1440 // 60:02d} h"


_DURATION = re.compile(r"([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*(m|min|h)?", re.I)
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


def parse_deadline(text: str, now: float | None = None) -> Deadline:
    """--deadline's value -> a Deadline (see the module docstring), or a ConfigError naming it."""
    now = time.time() if now is None else now
    raw = text
    text = str(text).strip()

    def refuse(why: str, hint: str = "") -> ConfigError:
        return ConfigError(f"--deadline has value {raw!r}{why}; allowed: {allowed_text()}{hint}")

    duration = _DURATION.fullmatch(text)
    if duration:
        amount = float(duration.group(1))
        minutes = amount * 60 if (duration.group(2) or "m").lower() == "h" else amount
        if minutes <= 0:
            raise refuse(", a duration that is not positive")
        if minutes > MAX_MINUTES:
            raise refuse(", a duration of more than a year")
        return Deadline(now + 60 * minutes, text)
    clock = _CLOCK.fullmatch(text)
    if clock:
        hour, minute, second = int(clock.group(1)), int(clock.group(2)), int(clock.group(3) or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise refuse(", which is not a time of day")
        today = dt.datetime.fromtimestamp(now).replace(hour=hour, minute=minute, second=second, microsecond=0)
        at = today.timestamp()  # naive: local time
        if at <= now:
            tomorrow = (today + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
            raise refuse(f", which has passed today ({span(now - at)} ago; HH:MM means today, local time)",
                         f"; for tomorrow give the date: {tomorrow}")
        return Deadline(at, text)
    try:
        when = dt.datetime.fromisoformat(iso_offset(text))
    except ValueError:
        raise refuse(", which is neither a time nor a duration") from None
    try:
        at = when.timestamp()  # naive: local time; with an offset: that offset
    except (OverflowError, ValueError, OSError):  # year 1 or 9999 in local time: outside what time zones cover
        at = -math.inf if when.year < 1970 else math.inf
    if at <= now:
        raise refuse(f", which has passed ({span(now - at)} ago)")
    if at - now > MAX_MINUTES * 60:
        raise refuse(f", which is {span(at - now)} ahead")
    return Deadline(at, text)


def iso_offset(text: str) -> str:
    """An ISO 8601 time as every supported Python reads it: a trailing `Z` (UTC) spelled `+00:00`, which
    `datetime.fromisoformat` accepts only from Python 3.11 (3.10 refused `2026-12-03T18:00Z`)."""
    return f"{text[:-1]}+00:00" if len(text) > 1 and text.endswith("Z") else text


def as_deadline(value: float | str | Deadline | None) -> Deadline | None:
    """SweepOptions.deadline -> a Deadline: a Unix time, a --deadline text (parsed now), or None."""
    if value is None or isinstance(value, Deadline):
        return value
    if isinstance(value, str):
        return parse_deadline(value)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value - time.time() > MAX_MINUTES * 60):
        raise ConfigError(f"deadline has value {value!r}; allowed: a Unix time at most a year ahead, or a "
                          f"--deadline text ({allowed_text()})")
    return Deadline(float(value), f"{value:.0f}")


def check_estimate(value: float | None, deadline: Any) -> None:
    """--deadline-estimate: seconds > 0 and at most a year (a deadline is at most a year ahead), and
    only with --deadline."""
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or value > MAX_MINUTES * 60):
        raise ConfigError(f"--deadline-estimate has value {value!r}; allowed: seconds per epoch of one Tune trial "
                          f"(per trial for tasks without epochs), a number > 0 and at most {MAX_MINUTES * 60:,} "
                          f"(a year)")
    if deadline is None:
        raise ConfigError(f"--deadline-estimate has value {value!r} but no --deadline is given; allowed: only "
                          f"with --deadline")


# ---- estimates ----
@dataclass(frozen=True)
class Measured:
    """One OK row of trials.parquet, as a rate."""

    row: dict[str, Any]  # its config values, for matching
    seconds: float  # finished_at - started_at
    epochs: int  # epochs that run trained (1 for tasks without epochs)
    epoch_s: float  # seconds of one epoch's training (train_s_per_epoch), at most seconds / epochs
    members: int  # how many trials ran together in its Tune trial (a fused group, an interleaved run)

    def predict(self, epochs: int, members: int) -> float:
        """Seconds for a run of `epochs` epochs with `members` members together (module docstring)."""
        d, m = self.seconds, self.epochs
        scaled = max(d * epochs / m, d - (m - epochs) * self.epoch_s)
        return scaled * max(1.0, members / self.members)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str  # one of LEVELS, FALLBACK


class Estimator:
    """Seconds a trial takes, from measured rows (or --deadline-estimate when there are none)."""

    def __init__(self, rows: Sequence[dict[str, Any]], task: str, *, has_epochs: bool,
                 fallback_s: float | None = None) -> None:
        self.task, self.has_epochs, self.fallback_s = task, has_epochs, fallback_s
        self.measured = measured_rows(rows, task, has_epochs)
        self._defaults = {f.name: f.default for f in fields(TrialConfig)}
        recipe = tuple(n for n in self._defaults if n not in UNMATCHED_FIELDS)
        model = tuple(n for s in MODEL_SECTIONS for n in section_fields()[s] if n not in UNMATCHED_FIELDS)
        self._levels: list[tuple[tuple[str, ...] | None, dict[tuple, list[Measured]]]] = []
        for names in (recipe, model, None):  # LEVELS: rows by the values that must agree
            table: dict[tuple, list[Measured]] = {}
            for m in self.measured:
                table.setdefault(self._key(m.row, names), []).append(m)
            self._levels.append((names, table))

    @classmethod
    def from_folder(cls, out_dir: Path, task: str, fallback_s: float | None = None) -> "Estimator":
        return cls(read_rows(Path(out_dir) / TRIALS_FILE), task, has_epochs=bool(task_metrics(task).epoch),
                   fallback_s=fallback_s)

    def trial(self, cfg: dict[str, Any], epochs: int, members: int = 1) -> Estimate | None:
        """Seconds for `cfg` with `epochs` epochs still to train, `members` of it running together."""
        epochs = epochs if self.has_epochs else 1
        for level, (names, table) in zip(LEVELS, self._levels):
            found = table.get(self._key(cfg, names))
            if found:
                longer = [m for m in found if m.epochs >= epochs]  # scaled down: the fixed cost counted once
                return Estimate(max(m.predict(epochs, members) for m in longer or found), level)
        if self.fallback_s is not None:
            return Estimate(self.fallback_s * epochs, FALLBACK)
        return None

    def _key(self, values: dict[str, Any], names: tuple[str, ...] | None) -> tuple:
        """What must agree at a level (a row's missing or null column: the field's default, as older code ran)."""
        if names is None:
            return ()
        picked = (self._defaults[n] if values.get(n) is None else values[n] for n in names)
        return tuple(tuple(v) if isinstance(v, list) else v for v in picked)


def measured_rows(rows: Sequence[dict[str, Any]], task: str, has_epochs: bool) -> list[Measured]:
    """The rows of `task` that can say how long a trial takes: status ok, a positive span, and (for
    tasks with epochs) at least one epoch trained in that run."""
    runs: dict[str, int] = {}
    for row in rows:
        if row.get("tune_trial_id"):
            runs[row["tune_trial_id"]] = runs.get(row["tune_trial_id"], 0) + 1
    out = []
    for row in rows:
        if row.get("status") != "ok" or row.get("task", task) != task:
            continue
        seconds = unix_time(row.get("finished_at")) - unix_time(row.get("started_at"))
        if not (math.isfinite(seconds) and seconds > 0):
            continue
        epochs = 1
        if has_epochs:
            done = _number(row.get("epochs_done"), _number(row.get("epochs"), 0))
            epochs = int(done - _number(row.get("resumed_from_epoch"), 0))
            if epochs < 1:
                continue
        per_epoch = _number(row.get("train_s_per_epoch"), math.nan) if has_epochs else math.nan
        per_epoch = seconds / epochs if not (per_epoch > 0) else min(per_epoch, seconds / epochs)
        members = _number(row.get("fused_members"), math.nan)
        if not (members >= 1):
            members = runs.get(row.get("tune_trial_id") or "", 1)
        out.append(Measured(row, seconds, epochs, per_epoch, int(members)))
    return out


def unix_time(value: Any) -> float:
    """A row's started_at / finished_at as Unix seconds (NaN where it holds none)."""
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    return _number(value, math.nan)


def _number(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return float(value)


def epochs_done(checkpoint_dir: Path, cfg: dict[str, Any]) -> int:
    """Epochs a trial's checkpoint already holds (0 without one, or with one this trial cannot use:
    it then trains from scratch or fails, so the whole run is what to plan for). Read through
    rpevit.checkpoint: weights only, matched to the trial's config."""
    from rpevit import checkpoint

    path = Path(checkpoint_dir) / checkpoint.CHECKPOINT_NAME
    if path.is_symlink() or not path.is_file():
        return 0
    try:
        state = checkpoint.load(path)
        checkpoint.check_matches(state, TrialConfig.from_dict(cfg), path)
        return max(0, int(state["epoch"]))
    except (ConfigError, OSError, KeyError, TypeError, ValueError):
        return 0


# ---- the plan ----
@dataclass(frozen=True)
class Unit:
    """One Tune trial to start or leave: its members' (trial_key, config), run as `kind`; a budget ladder's
    shorter trial also names the Tune trial whose trunk writes its checkpoint (`branch_of`, an index into the
    same units) and the trunk epoch that checkpoint holds (`branch_epoch`)."""

    members: tuple[tuple[str, dict[str, Any]], ...]
    kind: str = "single"  # single | fused | interleaved
    branch_of: int | None = None
    branch_epoch: int = 0
    pause_after: int | None = None  # --rungs-first, round 1: a trunk stops after this epoch
    from_epoch: int = 0  # --rungs-first, round 2: a paused trunk continues from this epoch

    def epochs_left(self, key: str, cfg: dict[str, Any], checkpoint_root: Path) -> tuple[int, int]:
        """(the epoch a member starts from, the epoch it stops after) in this Tune trial."""
        stop = int(cfg.get("epochs", 1))
        stop = min(stop, self.pause_after) if self.pause_after is not None else stop
        return max(epochs_done(trial_folder(checkpoint_root, key), cfg), self.from_epoch), stop


def unit_estimate(unit: Unit, estimator: Estimator, checkpoint_root: Path) -> Estimate | None:
    """Seconds for one Tune trial: a trial's own; a fused group's members run together (one
    member's time for their group size), sub-groups of members at different checkpoint epochs one
    after another; an interleaved timing run: its slowest member's time for its size."""
    left = [(cfg, max(0, stop - first)) for key, cfg in unit.members
            for first, stop in [unit.epochs_left(key, cfg, checkpoint_root)]]
    if unit.kind == "single":
        return estimator.trial(*left[0])
    if unit.kind == "interleaved":
        found = [estimator.trial(cfg, n, len(left)) for cfg, n in left]
        return None if None in found else max(found, key=lambda e: e.seconds)
    total, sources = 0.0, []
    for n in sorted({n for _, n in left}):
        sub = [cfg for cfg, m in left if m == n]
        found = [estimator.trial(cfg, n, len(sub)) for cfg in sub]
        if None in found:
            return None
        best = max(found, key=lambda e: e.seconds)
        total += best.seconds
        sources.append(best.source)
    return Estimate(total, min(sources, key=(LEVELS + (FALLBACK,)).index))


@dataclass
class DeadlinePlan:
    """Which Tune trials (indices into the units) start, which are left, and why."""

    deadline: Deadline
    slots: int
    admitted: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    estimates: list[Estimate | None] = field(default_factory=list)
    probe: bool = False  # nothing was known: the first unit starts alone, the rest is planned after it
    finish_at: float = math.nan  # predicted end of the last admitted unit
    no_probe: str = ""  # nothing was known and no probe starts: why
    startup_s: float = STARTUP_S  # counted before the first units start

    def estimate_text(self, indices: Sequence[int] | None = None) -> str:
        """'125-250 s per Tune trial (rows of: same recipe 3, same model 1)'; or why nothing is known."""
        chosen = [self.estimates[i] for i in (range(len(self.estimates)) if indices is None else indices)]
        known = [e for e in chosen if e is not None]
        if not known:
            unknown = "nothing known yet (no OK row of this task; --deadline-estimate not given)"
            return (f"{unknown}: the first pending trial starts alone as a probe" if self.probe else
                    f"{unknown}, and {self.no_probe or 'no probe starts'}")
        low, high = min(e.seconds for e in known), max(e.seconds for e in known)
        count = {s: sum(e.source == s for e in known) for s in LEVELS + (FALLBACK,)}
        sources = ", ".join(f"{s} {n}" for s, n in count.items() if n)
        spread = f"{span(low)}" if math.isclose(low, high, rel_tol=0.05) else f"{span(low)} to {span(high)}"
        return (f"{spread} per Tune trial (from rows of: {sources}; + {PER_TRIAL_S:.0f} s each, "
                f"{self.startup_s:.0f} s start-up; {self.slots} at a time)")


def branch_estimate(unit: Unit, units: Sequence[Unit], estimator: Estimator, checkpoint_root: Path
                    ) -> tuple[Estimate, int] | None:
    """A budget ladder's shorter trial run from its trunk's checkpoint: (seconds for its cool-down alone, the
    trunk epoch it starts from). None where it will not be: not a branch, it has a checkpoint of its own
    (unit_estimate counts from that), or its trunk resumes past the branch (it then runs on its own,
    rpevit.tasks.budget_ladder.plan_branches)."""
    if unit.branch_of is None or unit.kind != "single":
        return None
    (key, cfg), = unit.members
    trunk = units[unit.branch_of]
    (trunk_key, trunk_cfg), = trunk.members
    if epochs_done(trial_folder(checkpoint_root, key), cfg):
        return None
    start, stop = trunk.epochs_left(trunk_key, trunk_cfg, checkpoint_root)
    if unit.branch_epoch < start or (unit.branch_epoch == start and start > 0) or unit.branch_epoch > stop:
        return None
    found = estimator.trial(cfg, max(0, int(cfg.get("epochs", 1)) - unit.branch_epoch))
    return (found, start) if found is not None else None


def plan_units(units: Sequence[Unit], estimator: Estimator, *, slots: int, now: float, deadline: Deadline,
               checkpoint_root: Path, probe: bool = True, startup_s: float = STARTUP_S) -> DeadlinePlan:
    """Admit the units, in order, that the slot simulation ends before the deadline (module docstring),
    counting `startup_s` before the first start; when nothing is known, the first unit alone as a
    probe if `probe` and start-up leaves time for it (else none, and `no_probe` says why).

    A budget ladder's shorter trial costs its cool-down alone where its trunk is admitted before it and, in
    the simulation, has passed the branch epoch when the shorter trial's slot frees (its epochs spread evenly
    over its estimate); otherwise the whole run, as it then trains on its own."""
    estimates = [unit_estimate(u, estimator, Path(checkpoint_root)) for u in units]
    branched = [branch_estimate(u, units, estimator, Path(checkpoint_root)) for u in units]
    plan = DeadlinePlan(deadline, max(1, slots), estimates=estimates, startup_s=startup_s)
    if not units:
        return plan
    if all(e is None for e in estimates):
        plan.probe = probe and now + startup_s < deadline.at
        if not plan.probe:
            plan.no_probe = ("the probe left no OK row to plan from" if not probe else
                             f"the deadline leaves no time for a probe ({startup_s:.0f} s of start-up alone would "
                             f"pass it)")
        plan.admitted = [0] if plan.probe else []
        plan.left = list(range(1 if plan.probe else 0, len(units)))
        return plan
    free = [now + startup_s] * plan.slots
    heapq.heapify(free)
    ends, started = [], {}
    for i, est in enumerate(estimates):
        branch, trunk = branched[i], units[i].branch_of
        if branch is not None and trunk in started and estimates[trunk] is not None:
            begun, first = started[trunk], branch[1]
            (trunk_key, trunk_cfg), = units[trunk].members
            trunk_epochs = max(1, units[trunk].epochs_left(trunk_key, trunk_cfg, Path(checkpoint_root))[1] - first)
            reached = begun + PER_TRIAL_S + estimates[trunk].seconds * (units[i].branch_epoch - first) / trunk_epochs
            if free[0] >= reached:
                est = plan.estimates[i] = branch[0]
        end = free[0] + PER_TRIAL_S + est.seconds if est is not None else math.inf
        if end <= deadline.at:
            started[i] = free[0]
            heapq.heapreplace(free, end)
            plan.admitted.append(i)
            ends.append(end)
        else:
            plan.left.append(i)
    plan.finish_at = max(ends, default=math.nan)
    return plan


def resume_command(source: str, name: str, results_dir: Any, data_dir: str | None, flags: Sequence[str] = (),
                   deadline: bool = False) -> str:
    """The command line that continues this sweep: same space, name, folders and `flags` (sweep.py's
    resume_flags: what selects the trials, where and how they run), --resume; with `deadline`, a --deadline
    placeholder."""
    parts = ["python", "sweep.py", "--space", str(source), "--name", name, "--results-dir", str(results_dir)]
    if data_dir is not None:
        parts += ["--data-dir", str(data_dir)]
    command = shlex.join([*parts, *map(str, flags), "--resume"])
    return f"{command} --deadline {NEW_DEADLINE}" if deadline else command
