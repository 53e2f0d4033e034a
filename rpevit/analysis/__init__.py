"""Analysis over sweep results (Parquet): gap closure, efficiency, kernel MSE, one report.md.

Each module is also a script in the repository's analysis/ folder (python analysis/<name>.py
RESULTS_DIR) and is importable for tests and notebooks (from rpevit.analysis import gap_closure).
"""
