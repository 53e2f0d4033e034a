"""Sweeps on Ray Tune: YAML space -> explicit trial list -> Tune trials -> Parquet rows.

space.py expands and validates a YAML space in the driver (what dry-run shows is what runs),
trainable.py runs one trial inside Ray, results.py owns the trials/epochs Parquet files (writer.py
is the Tune callback that writes them), and runner.py runs a sweep through its layers: lock.py,
plan.py (resume, resources), launch_plan.py (the Tune trials and deadline rounds, planned without
Ray), session.py (Ray), tune_run.py (runs the planned Tune trials, progress), summary.py.
"""
from rpevit.sweep.space import Space, SpaceError, load_space, trial_key

__all__ = ["Space", "SpaceError", "load_space", "trial_key"]
