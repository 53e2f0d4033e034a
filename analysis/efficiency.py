"""What each variant costs, and how its time grows with the token count N.

The script form of rpevit.analysis.efficiency, whose docstring has the details:
    python analysis/efficiency.py --help
"""
from rpevit.analysis.efficiency import main

if __name__ == "__main__":
    main()
