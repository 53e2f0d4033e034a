"""Single-trial CLI, no Ray: `python -m rpevit.cli --dataset digits --attention softmax --pe ape`.

Every TrialConfig field is a flag (underscores as dashes), listed by section in --help with its
help text, default and allowed values (rpevit.config.field_help). Prints one progress line per
epoch and, last, the summary row as one JSON object. `--task bench|kernel_mse` runs those tasks the same way.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import ExitStack
from dataclasses import fields
from pathlib import Path

from rpevit import checkpoint, registry
from rpevit.config import SECTIONS, ConfigError, TrialConfig, field_help, field_types
from rpevit.data import DataError


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrialConfig field, grouped by section, each with its help, default and allowed values."""
    # allow_abbrev=False: `--epoch 1` is refused, not read as `--epochs` (sweep.py's `--set epoch=3` is refused too)
    parser = argparse.ArgumentParser(prog="python -m rpevit.cli", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    types = field_types()
    groups = {name: parser.add_argument_group(f"{name} options") for name in SECTIONS}
    for f in fields(TrialConfig):
        choices = f.metadata.get("choices")
        switch = bool(choices) and choices[0] == "off" and "on" in choices  # `--compile` alone means on
        groups[f.metadata["section"]].add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=types[f.name], default=None, choices=choices,
            metavar=None if choices else types[f.name].__name__.upper(),
            help=field_help(f.name).replace("%", "%%") + (" (the flag alone: on)" if switch else ""),
            **({"nargs": "?", "const": "on"} if switch else {}),
        )
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save a checkpoint after every epoch here and resume from it if present "
                             "(only a checkpoint written under the same config is continued)")
    parser.add_argument("--extend-epochs", action="store_true",
                        help="allow continuing a checkpoint to more --epochs than its run planned "
                             "(the lr schedule becomes the longer run's from the current step)")
    parser.add_argument("--quiet", action="store_true", help="print only the final JSON row")
    return parser


def _json_safe(row: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def check_runnable(cfg: TrialConfig, *, checkpoint_dir: str | None, extend_epochs: bool) -> None:
    """What the config alone cannot know: this machine's devices and the CLI-only options.

    Checked before any data is loaded or any epoch is trained (an error after an epoch loses it).
    """
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("command line: field 'device' has value 'cuda' but torch sees no CUDA device "
                              "here; allowed: cpu, auto")
    if checkpoint_dir == "":  # '' would save nothing and resume nothing
        raise ConfigError(f"command line: --checkpoint-dir has value {checkpoint_dir!r}; allowed: a folder "
                          f"(leave --checkpoint-dir out for no checkpoints)")
    if extend_epochs and checkpoint_dir is None:
        raise ConfigError("command line: --extend-epochs is given without --checkpoint-dir; allowed: only with "
                          "--checkpoint-dir (it continues that folder's checkpoint to more --epochs)")
    if extend_epochs and cfg.task != "train":
        raise ConfigError(f"command line: --extend-epochs is given for task {cfg.task!r}; allowed: only with "
                          f"task 'train' (the only task with checkpoints)")
    if checkpoint_dir is not None:
        checkpoint.prepare_dir(checkpoint_dir)


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    checkpoint_dir, quiet = args.pop("checkpoint_dir"), args.pop("quiet")
    if checkpoint_dir:  # a folder the user names may be a link of theirs: resolved here, rpevit writes in the target
        checkpoint_dir = str(Path(checkpoint_dir).expanduser().resolve())
    extend_epochs = args.pop("extend_epochs")
    given = {k: v for k, v in args.items() if v is not None}
    with ExitStack() as held:  # the checkpoint folder held from its first check to the run's end: one run there
        try:
            cfg = TrialConfig.from_dict(given, source="command line").resolved()  # the row says what ran
            if checkpoint_dir:
                held.enter_context(checkpoint.claimed(checkpoint_dir))
            check_runnable(cfg, checkpoint_dir=checkpoint_dir, extend_epochs=extend_epochs)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        registry.load_all()
        task = registry.TASKS[cfg.task]
        log = None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
        extra = {"extend_epochs": True} if extend_epochs else {}
        try:
            row = task(cfg, checkpoint_dir=checkpoint_dir, log=log, **extra)
        except (DataError, ConfigError) as err:  # ConfigError includes CheckpointError
            print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
    print(json.dumps(_json_safe(row), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
