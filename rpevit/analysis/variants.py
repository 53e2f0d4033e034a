"""What the analysis knows of each backend and encoding: its label, colour, family, groups and order, read
from what it declared where it registered (rpevit.registry.Display), with no model built; and the one
colour map of every figure.

A figure colours the backends (kind "attention") or encodings (kind "pe") it draws by `colours(kind,
names)`: each one's colour declared where it registers, so a registered variant has the same colour in
every figure whatever else is drawn or registered; else a FALLBACK colour picked by a hash of the name
(CRC-32, the same in every process), moved to the next free one only where another undeclared name of
the same figure has it. The fallback colours are none of the tab10 colours "C0".."C9" that the declared
ones use. Names that are not one registered variant, 'ape+rope' or 'sparse_cayley_string
(string_sparsity=0.1)', are their own variant: the fallback of the whole name. Legends name what is
drawn with `label`, in `sort_key` order, in the colours of the same map.
"""
from __future__ import annotations

import zlib
from typing import Iterable

from rpevit import config, registry

ATTENTION, PE = "attention", "pe"
IDENTITY = "-identity"  # common.with_variant's suffix for a random-feature backend that draws no features
STRING = "string"  # Display.groups tag: a STRING encoding, RoPE(r) P
STRING_STUDY = "string_study"  # Display.groups tag: compared in the STRING study without being a STRING
STRING_REFERENCE = "rope"  # the STRING with P = I: what the STRINGs are compared and timed against
# named colours far from every tab10 colour "C0".."C9" (which the declared ones use) and from each other
FALLBACK = ("navy", "teal", "darkgoldenrod", "magenta", "gold")


def display(kind: str, name: str) -> registry.Display | None:
    """The registered Display of `name` (None where `name` is no one registered variant)."""
    config.load_registry()
    return registry.display(kind, str(name))


def _identity_of(kind: str, name: str) -> registry.Display | None:
    """The Display of the backend whose '-identity' label `name` is (None otherwise)."""
    if kind != ATTENTION or not str(name).endswith(IDENTITY):
        return None
    return display(kind, str(name).removesuffix(IDENTITY))


def declared_colour(kind: str, name: str) -> str | None:
    """The colour `name` declares where it registers (a backend's '-identity' label: its identity_colour);
    None where it declares none or is no registered variant. One matplotlib cannot read is refused in one
    line naming the variant."""
    shown, declared = display(kind, name), None
    if shown is not None:
        declared = shown.colour
    elif (base := _identity_of(kind, name)) is not None:
        declared = base.identity_colour
    if declared is None:
        return None
    from matplotlib.colors import is_color_like

    if not is_color_like(declared):
        raise ValueError(f"{kind} {name!r} declares colour {declared!r}; allowed: a matplotlib colour ('C3', "
                         f"'tab:red', '#1f77b4')")
    return declared


def colours(kind: str, names: Iterable[str]) -> dict[str, str]:
    """The one colour map, for the names one figure draws: each name's declared colour, else its FALLBACK
    colour (at a CRC-32 hash of kind and name, the same in every process), or, where an undeclared name
    drawn beside it (taken in name order) already has that one, the next free FALLBACK colour, so no two
    names of a figure share a colour while FALLBACK lasts."""
    out: dict[str, str] = {}
    undeclared = []
    for name in sorted(set(map(str, names))):
        declared = declared_colour(kind, name)
        if declared is None:
            undeclared.append(name)
        else:
            out[name] = declared
    for name in undeclared:
        start = FALLBACK.index(fallback_colour(kind, name))
        free = [c for c in (FALLBACK[(start + i) % len(FALLBACK)] for i in range(len(FALLBACK)))
                if c not in out.values()]
        out[name] = free[0] if free else FALLBACK[start]
    return out


def fallback_colour(kind: str, name: str) -> str:
    """The FALLBACK colour of an undeclared name: at a CRC-32 hash of kind and name (the same in every process)."""
    return FALLBACK[zlib.crc32(f"{kind}:{name}".encode()) % len(FALLBACK)]


def colour(kind: str, name: str) -> str:
    """The colour of one name drawn alone (colours)."""
    return colours(kind, [name])[str(name)]


def label(kind: str, name: str) -> str:
    """The legend name: a registered variant's declared label ('-identity' kept), else `name` itself."""
    shown = display(kind, name)
    if shown is not None:
        return shown.label
    base = _identity_of(kind, name)
    return str(name) if base is None else base.label + IDENTITY


def sort_key(kind: str, name: str) -> tuple[int, str]:
    """Legend order: the declared order (a '-identity' label right after its backend; undeclared last),
    ties by name."""
    shown = display(kind, name) or _identity_of(kind, name)
    return (registry.UNORDERED if shown is None else shown.order, str(name))


def ordered(kind: str, names: Iterable[str]) -> list[str]:
    """The distinct names, in legend order (sort_key)."""
    return sorted(set(map(str, names)), key=lambda n: sort_key(kind, n))


def family(pe: str) -> str:
    """The panel an encoding is drawn in beside its relatives: its declared family (its name if none)."""
    shown = display(PE, pe)
    return pe if shown is None else shown.family


def families(pes: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(family, its encodings among `pes`) per family of `pes`, in the order of their first encoding."""
    grouped: dict[str, list[str]] = {}
    for pe in ordered(PE, pes):
        grouped.setdefault(family(pe), []).append(pe)
    return [(name, tuple(members)) for name, members in grouped.items()]


def in_group(group: str) -> tuple[str, ...]:
    """The registered encodings that declare `group` among their groups, in legend order."""
    config.load_registry()
    return tuple(ordered(PE, (name for name, cls in registry.POSITION_ENCODINGS.items()
                              if group in getattr(vars(cls).get("display"), "groups", ()))))
