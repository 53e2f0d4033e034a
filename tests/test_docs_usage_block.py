"""docs/sweeps.md opens with the usage of `python sweep.py`: every option the parser takes is in it
(a flag added to sweep.py and not to the docs fails here), and it names no option the parser lacks."""
import re
from pathlib import Path

import sweep

ROOT = Path(__file__).resolve().parents[1]


def usage_block() -> str:
    text = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(python sweep\.py.*?)```", text, re.S)
    assert block, "docs/sweeps.md has no ```bash block starting with `python sweep.py`"
    return block.group(1)


def test_every_sweep_option_is_in_the_usage_block_and_nothing_else():
    block = usage_block()
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", block))
    options = [a.option_strings for a in sweep.build_parser()._actions if a.option_strings != ["-h", "--help"]]
    missing = [strings for strings in options if not named & set(strings)]
    assert not missing, f"sweep.py options missing from docs/sweeps.md's usage block: {missing}"
    known = {s for strings in options for s in strings}
    unknown = sorted(named - known)
    assert not unknown, f"docs/sweeps.md's usage block names options sweep.py does not take: {unknown}"
