"""One report.md with every table and figure that applies to RESULTS_DIR.

The script form of rpevit.analysis.report, whose docstring has the details:
    python analysis/report.py --help
"""
from rpevit.analysis.report import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
