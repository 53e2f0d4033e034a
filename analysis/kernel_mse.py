"""Random-feature estimators of exp(x^T y): closed-form MSE beside Monte Carlo, against m, per projection.

The script form of rpevit.analysis.kernel_mse, whose docstring has the details:
    python analysis/kernel_mse.py --help
"""
from rpevit.analysis.kernel_mse import main
from rpevit.tool_exit import run_tool

if __name__ == "__main__":
    run_tool(main)
