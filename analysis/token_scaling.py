"""Where the efficient variants pay: time and memory against the token count N, and the crossovers.

The script form of rpevit.analysis.token_scaling, whose docstring has the details:
    python analysis/token_scaling.py --help
"""
from rpevit.analysis.token_scaling import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
