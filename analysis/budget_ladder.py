"""A budget ladder's answer: accuracy against training budget per variant, and ranking stability.

The script form of rpevit.analysis.budget_ladder, whose docstring has the details:
    python analysis/budget_ladder.py --help
"""
from rpevit.analysis.budget_ladder import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
