"""Generated text inside hand-written Markdown: blocks between markers that a script rewrites, and the
check that the committed text still equals what the script would write.

Numbers typed by hand go stale (issue 41): the README quoted a 3-seed subset after report.md had moved
to 5 seeds. So a figure in prose lives between two HTML comments (invisible in rendered Markdown)

    <!-- BEGIN GENERATED name: `python analysis/answers.py results` rewrites this block; do not edit -->
    ...text written by the analysis code...
    <!-- END GENERATED name -->

and `fill` replaces each block's body with the text its generator produces. A file may also be
generated whole (results/ANSWERS.md). `stale` compares the committed files with what would be written,
so a test (tests/test_answers.py) fails the moment text and numbers part, naming the command that
regenerates them. Writes are atomic and never follow a symbolic link.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Callable, Mapping

NAME = r"[A-Za-z0-9_.-]+"
BEGIN = "<!-- BEGIN GENERATED {name}: `{command}` rewrites this block; do not edit -->"
END = "<!-- END GENERATED {name} -->"
_BEGIN_RE = re.compile(rf"<!-- BEGIN GENERATED (?P<name>{NAME})(?::[^>]*)? -->")
_END_RE = re.compile(rf"<!-- END GENERATED (?P<name>{NAME}) -->")
WHOLE_FILE = "<!-- GENERATED FILE: `{command}` writes it from the committed results; do not edit -->"


class GeneratedTextError(ValueError):
    """A marker that cannot be used: unbalanced, nested, or naming no known block."""


def block_names(text: str) -> list[str]:
    """The names of the generated blocks in text, in order."""
    return [m["name"] for m in _BEGIN_RE.finditer(text)]


def fill(text: str, blocks: Mapping[str, Callable[[], str]], command: str, source: str) -> str:
    """text with the body of every generated block replaced by its generator's output (and its BEGIN line
    rewritten to name `command`). One line naming the file and the marker where markers are unbalanced,
    nested or name a block that has no generator."""
    out, pos = [], 0
    while (begin := _BEGIN_RE.search(text, pos)) is not None:
        name = begin["name"]
        end = _END_RE.search(text, begin.end())
        if end is None or end["name"] != name:
            raise GeneratedTextError(f"{source}: generated block {name!r} has no matching "
                                     f"'{END.format(name=name)}'; allowed: one END marker per BEGIN, blocks not nested")
        nested = _BEGIN_RE.search(text, begin.end(), end.start())
        if nested is not None:
            raise GeneratedTextError(f"{source}: generated block {nested['name']!r} starts inside block {name!r}; "
                                     f"allowed: blocks that do not nest")
        if name not in blocks:
            raise GeneratedTextError(f"{source}: generated block {name!r} has no generator; allowed: "
                                     f"{', '.join(sorted(blocks))}")
        body = blocks[name]().strip("\n")
        out += [text[pos:begin.start()], BEGIN.format(name=name, command=command), "\n", body, "\n",
                END.format(name=name)]
        pos = end.end()
    stray = _END_RE.search(text, pos)
    if stray is not None:
        raise GeneratedTextError(f"{source}: '{stray.group(0)}' closes no block; allowed: an END marker after its "
                                 f"BEGIN marker")
    out.append(text[pos:])
    return "".join(out)


def whole_file(body: str, command: str) -> str:
    """A file generated whole: a first line saying so, then body."""
    return WHOLE_FILE.format(command=command) + "\n\n" + body.strip("\n") + "\n"


def stale(expected: Mapping[Path, str], root: Path, context: int = 12) -> list[str]:
    """For every file whose committed text differs from `expected`, one message: the file (relative to
    root) and the start of a unified diff (committed -> regenerated). Empty when all agree."""
    messages = []
    for path, text in expected.items():
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        if committed == text:
            continue
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        diff = list(difflib.unified_diff(committed.splitlines(), text.splitlines(), f"{rel} (committed)",
                                         f"{rel} (regenerated)", n=1, lineterm=""))
        shown = diff[:context] + ([f"... ({len(diff) - context} more diff lines)"] if len(diff) > context else [])
        messages.append(f"{rel} differs from the text the analysis code writes:\n" + "\n".join(shown))
    return messages


def write_atomic(path: Path, text: str) -> None:
    """path replaced by text in one step (a temporary file beside it, then os.replace), never through a
    symbolic link: a planted link at the temporary name or at path is not followed."""
    if path.is_symlink():
        raise GeneratedTextError(f"{path} is a symbolic link; allowed: a regular file (the analysis never writes "
                                 f"through a link)")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


__all__ = ["BEGIN", "END", "GeneratedTextError", "block_names", "fill", "stale", "whole_file", "write_atomic"]
