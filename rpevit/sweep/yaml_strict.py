"""The YAML loader of search spaces and `--set` values: safe, YAML 1.2 scalars, no surprises.

`yaml.SafeLoader` runs no code, but reads a space in ways that silently change what runs or
that exhaust the machine (issue 31):

- YAML 1.1 scalars: `epochs: 1:30` is 90 (sexagesimal), `yes` / `no` / `on` / `off` are
  booleans, `010` is 8, `2024-01-02` a date, `1e3` a string. Here the YAML 1.2 core schema
  holds: null (`~`, `null`, empty), booleans `true` / `false` only, decimal integers (plus
  `0o` octal, `0x` hex), floats with optional exponent (`1e3`, `1.0e-3`, `.5`, `.inf`, `.nan`);
  everything else is a string.
- Duplicate keys: the last one silently won (two `grid:` keys ran only the second). Refused,
  naming the key. A merge (`<<: *base`) may still be overridden by the mapping's own keys.
- Aliases: `&a [x, x]`, `&b [*a, *a]`, ... ("billion laughs") builds a shared structure in
  microseconds that is 10^9 values once anything walks or formats it (an error message, the
  trial key). Each document's size with every alias expanded is computed before anything is
  constructed, and refused when aliases add more than MAX_ALIAS_NODES nodes; an alias inside
  its own anchor (a cycle) is refused too. Small anchors (`pe: &all_pe [ape, rope]`, then
  `pe: *all_pe`) stay fine.
- Nesting deeper than MAX_DEPTH would end in a RecursionError inside the composer; refused.

Every refusal is a `yaml.YAMLError` (StrictYAMLError) whose message says what is allowed, so
callers that already catch YAML errors turn it into their one-line message.
"""
from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_ALIAS_NODES = 100_000  # nodes aliases may add when expanded; a real space adds hundreds
MAX_DEPTH = 100  # nesting of sequences / mappings; a real space nests 4 deep
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictYAMLError(yaml.YAMLError):
    """A document the strict loader refuses; the message names what and says what is allowed."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, no duplicate keys and bounded alias expansion."""

    yaml_implicit_resolvers: dict = {}  # filled below: only the YAML 1.2 core schema (+ merge keys)

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    # ---- composing: depth while nodes are built, alias expansion once a document is built
    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise StrictYAMLError(f"nesting deeper than {MAX_DEPTH} levels (at line {mark.line + 1}, column "
                                      f"{mark.column + 1}); allowed: at most {MAX_DEPTH} nested lists / mappings")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()
        check_alias_expansion(node)
        return node

    # ---- constructing
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            self._check_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _check_duplicates(self, node: MappingNode) -> None:
        """Each key once among a mapping's own keys (those of a `<<` merge may be overridden, but
        a mapping merged in is checked itself)."""
        seen: dict[Any, Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                for part in merged:
                    if isinstance(part, MappingNode):
                        self._check_duplicates(part)
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeConstructor refuses it itself
                continue
            if first is not key_node:
                raise StrictYAMLError(
                    f"duplicate key {_short(key) if isinstance(key, str) else repr(key)} in one mapping (line "
                    f"{first.start_mark.line + 1} and line {key_node.start_mark.line + 1}); allowed: each key "
                    f"once per mapping (the last one would silently win)")

    def construct_yaml_int(self, node: ScalarNode) -> int:
        text = self._core_scalar(node, INT, "an integer (decimal, 0o octal or 0x hex)")
        try:
            if text[:2] in ("0o", "0x"):
                return int(text[2:], 8 if text[1] == "o" else 16)
            return int(text, 10)
        except ValueError as err:  # more digits than Python converts (sys.get_int_max_str_digits)
            raise StrictYAMLError(f"int has value {_short(text)} (line {node.start_mark.line + 1}), which has "
                                  f"{len(text):,} characters; allowed: an integer of at most 4,300 digits") from err

    def construct_yaml_float(self, node: ScalarNode) -> float:
        text = self._core_scalar(node, FLOAT, "a number such as 1.5, 1e-3, .inf or .nan").lower()
        return float(text.replace(".inf", "inf").replace(".nan", "nan"))

    def construct_yaml_bool(self, node: ScalarNode) -> bool:
        return self._core_scalar(node, BOOL, "true or false").lower() == "true"

    def _core_scalar(self, node: ScalarNode, pattern: re.Pattern, allowed: str) -> str:
        """The scalar's text, if it is what the YAML 1.2 core schema calls this type (an explicit
        `!!int 1:30` or `!!bool yes` is refused here rather than read the YAML 1.1 way)."""
        text = self.construct_scalar(node)
        if not pattern.match(text):
            raise StrictYAMLError(f"{node.tag.rsplit(':', 1)[-1]} has value {_short(text)} (line "
                                  f"{node.start_mark.line + 1}); allowed: {allowed}")
        return text


def check_alias_expansion(root: Node | None) -> None:
    """Refuse a document whose aliases would expand it by more than MAX_ALIAS_NODES nodes, or
    that holds an alias inside its own anchor. One visit per distinct node, no recursion."""
    if root is None:
        return
    sizes: dict[int, int] = {}  # id(node) -> nodes of its subtree with every alias expanded
    on_path: set[int] = set()  # the nodes whose subtree is being visited: an alias to one is a cycle
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # post-order: a node's size once its children's are known
        node, children_done = stack.pop()
        children = _children(node)
        if children_done:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            continue
        if id(node) in sizes:  # a second alias of a value already measured
            continue
        on_path.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise StrictYAMLError(f"an alias refers to its own anchor (line {child.start_mark.line + 1}): "
                                      f"the value would contain itself; allowed: aliases of finished values only")
            if id(child) not in sizes:
                stack.append((child, False))
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise StrictYAMLError(f"aliases (*name) expand the document by {added:,} values (an alias bomb?); "
                              f"allowed: at most {MAX_ALIAS_NODES:,} values added by aliases: anchor small values "
                              f"such as a list of encodings, or write them out")


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _short(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} characters)"


def load(text: str) -> Any:
    """One YAML document, read strictly (StrictYAMLError / yaml.YAMLError when refused)."""
    return yaml.load(text, Loader=StrictLoader)


# ---- the YAML 1.2 core schema's implicit types (https://yaml.org/spec/1.2.2/#1023-core-schema)
NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                   r"|\.(?:nan|NaN|NAN))$")
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:null", NULL, ["~", "n", "N", ""])
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", BOOL, list("tTfF"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", INT, list("-+0123456789"))  # before float: 3 is int
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))
StrictLoader.add_implicit_resolver(MERGE_TAG, re.compile(r"^(?:<<)$"), ["<"])  # `<<: *base` (string_variants)
StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)
StrictLoader.add_constructor("tag:yaml.org,2002:bool", StrictLoader.construct_yaml_bool)
