"""A choice made on the validation split (luo_scale, the redraw schedule): the winner and its test figure.

The script form of rpevit.analysis.validation_choice, whose docstring has the details:
    python analysis/validation_choice.py --help
"""
from rpevit.analysis.validation_choice import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
