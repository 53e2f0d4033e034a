"""How fast the random mode of `rotinv` concentrates on p(|c_i - c_j|^2), against m draws.

The script form of rpevit.analysis.rotinv_concentration, whose docstring has the details:
    python analysis/rotinv_concentration.py --help
"""
from rpevit.analysis.rotinv_concentration import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
