"""Sweeps on Ray Tune: YAML space -> explicit trial list -> Tune trials -> Parquet rows.

space.py expands and validates a YAML space in the driver (what dry-run shows is what runs),
trainable.py runs one trial inside Ray, results.py writes trials/epochs Parquet files atomically,
runner.py wires them to a Tuner (resources, GPU spreading, resume, failures, progress).
"""
from rpevit.sweep.space import Space, SpaceError, load_space, trial_key

__all__ = ["Space", "SpaceError", "load_space", "trial_key"]
