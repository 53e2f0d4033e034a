"""What each variant costs, and how its time grows with the token count N.

The script form of rpevit.analysis.efficiency, whose docstring has the details:
    python analysis/efficiency.py --help
"""
from rpevit.analysis.efficiency import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
