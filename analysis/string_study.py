"""The STRING study: accuracy of each STRING variant, its cost relative to RoPE, and accuracy against f.

The script form of rpevit.analysis.string_study, whose docstring has the details:
    python analysis/string_study.py --help
"""
from rpevit.analysis.string_study import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
