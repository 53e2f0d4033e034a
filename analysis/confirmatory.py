"""The confirmatory table of a study: exactly the comparisons its space declared before it ran.

The script form of rpevit.analysis.confirmatory, whose docstring has the details:
    python analysis/confirmatory.py --help
"""
from rpevit.analysis.confirmatory import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
