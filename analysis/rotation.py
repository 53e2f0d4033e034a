"""The rotation study: what a rotation-invariant RPE buys where rotation matters (accuracy at test rotations).

The script form of rpevit.analysis.rotation, whose docstring has the details:
    python analysis/rotation.py --help
"""
from rpevit.analysis.rotation import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
