"""The project's answers, written from the committed Parquet: results/ANSWERS.md and the generated blocks of
README.md, results/README.md and docs/*.md.

The script form of rpevit.analysis.answers, whose docstring has the details:
    python analysis/answers.py results            # rewrite them
    python analysis/answers.py results --check    # exit 1 naming each stale file
"""
from rpevit.analysis.answers import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
