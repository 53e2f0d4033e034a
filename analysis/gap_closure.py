"""How much of the softmax-vs-Performer accuracy gap each position encoding closes, draw-aware.

The script form of rpevit.analysis.gap_closure, whose docstring has the details:
    python analysis/gap_closure.py --help
"""
from rpevit.analysis.gap_closure import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
