"""Text read from a results file reaches the generated Markdown inert (rpevit.analysis.common.md_text), and
a value made inert is not escaped a second time where it is printed.

Three gaps a review found, each shown failing before its fix:
- bare URLs and e-mail addresses (`https://...`, `www.example.com`, `user@host.tld`) were left live, and
  GitHub's renderer (cmark-gfm's autolink extension) turns them into links;
- `*`, `_` and `~` were left live: a forged name opened emphasis or strikethrough that ran into the
  generated text beside it;
- `$` was left live: GitHub renders `$...$`, `$$...$$` and a code span between two `$` as math, so a forged name
  typeset its text as a formula, or paired with a `$` of generated text beside it;
- a name already made inert (a frame's `sweep`, read through untrusted_names) was put into a code span,
  where no escape is undone: `odd\\[x\\]` was printed for the folder `odd[x]`.

The checks on the text itself, and the same values rendered as GitHub renders them: cmarkgfm (Python
bindings of GitHub's cmark-gfm) is a dev dependency, so these checks run wherever the tests do.
"""
from __future__ import annotations

import html
import random
import re
from pathlib import Path

import cmarkgfm  # GitHub's renderer: a dev dependency (pyproject.toml), so no rendering check ever skips
import pandas as pd
import pytest

from rpevit.analysis import (answers_cost, answers_sources, answers_validation, answers_wording, budget_ladder, common,
                             report, token_scaling)
from rpevit.analysis.common import code_span, md_text
from rpevit.sweep import declaration
from rpevit.sweep.declaration import DECLARATION_FILE, parse
from tests.analysis_rows import config_row, write_sweep
from tests.test_declaration import DECLARE


# names as the published results hold them: every one prints exactly as it is
ORDINARY = ["luo_rpe", "circulant_string", "cifar10_ladder40_cpu", "favor+circulant_string", "relu_rf",
            "sparse_cayley_string (f=0.05)", "cifar10_val_luo_scale_cpu", "a__b", "1_000", "rope_mixed 2x2",
            "softmax+ape", "Python 3.11.7", "torch 2.5.1+cpu", "x86_64", "sha256:0f3a", "e.g. www", "a.b.c"]
AUTOLINKS = ["https://evil.example/x", "http://evil.example", "ftp://evil.example/f", "HTTPS://evil.example",
             "www.evil.example", "WWW.evil.example", "(www.evil.example)", "*www.evil.example", "_www.evil.example",
             "a_www.evil.example", "~www.evil.example", "user@evil.example", "first.last+tag@mail.evil.example",
             "mailto:user@evil.example", "xmpp:user@evil.example", "see https://a.example and me@b.example",
             "a_@b.example"]
EMPHASIS = ["*x*", "**x**", "_x_", "__x__", "___x___", "~x~", "~~x~~", "a*b*c", "a**b**c", "x_ y_", "_x", "x_",
            "*", "_", "~~", "a_(b)_c", "(_x_)", "_x_y", "x *y* z", "a~~b~~c", "é_x_é", "a_~b~_c"]
MATH = ["$x$", "$$x^2$$", "a $b$ c", "$`x`$", "cost $5", "$"]  # GitHub's math delimiters (rendered after cmark-gfm)


def live_dollars(text: str) -> list[str]:
    """`$` of text that no backslash escapes: what GitHub's math reads as a delimiter (an escaped `\\$` is a
    dollar sign)."""
    return [m[2] for m in re.finditer(r"(\\*)(\$)", text) if len(m[1]) % 2 == 0]


def unescaped_stars_or_tildes(text: str) -> list[str]:
    """`*` and `~` of text that no backslash escapes (an odd run of backslashes before one escapes it)."""
    return [m[2] for m in re.finditer(r"(\\*)([*~])", text) if len(m[1]) % 2 == 0]


def live_autolink_marks(text: str) -> list[str]:
    """`://` and `www.` of text whose `:` or `.` no backslash escapes (what the autolink extension matches)."""
    return [m[0] for m in re.finditer(r"(\\*)(:(?=//)|(?<=[wW]{3})\.)", text) if len(m[1]) % 2 == 0]


def live_underscores(text: str) -> list[str]:
    """Runs of `_` in text that are not escaped and could be an emphasis delimiter: a side that is not an ASCII
    letter or digit (GFM: only then can a `_` run open or close emphasis)."""
    found = []
    for m in re.finditer(r"(\\*)(_+)", text):
        if len(m[1]) % 2:  # escaped: its first `_` is text; the rest is checked as its own run
            continue
        before = text[m.start(2) - 1] if m.start(2) else " "
        after = text[m.end(2)] if m.end(2) < len(text) else " "
        if not (before.isascii() and before.isalnum() and after.isascii() and after.isalnum()):
            found.append(m[0])
    return found


# ---------------------------------------------------------------- on the text itself (no renderer needed)
@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_print_as_they_are(name):
    assert md_text(name) == name and not common._UNSAFE.search(name)


@pytest.mark.parametrize("value", AUTOLINKS)
def test_no_bare_url_or_address_is_left_to_autolink(value):
    """cmark-gfm's autolink extension matches `://` (at its `:`) and `www.` (at its first `w`) in the source,
    and an e-mail address in the parsed text, adjacent text nodes joined first (extensions/autolink.c:
    postprocess calls cmark_consolidate_text_nodes), so `\\@` would still link: every `@` gets a WORD JOINER
    before it instead, and an `@` with no local part before it links nothing."""
    text = md_text(value)
    assert not live_autolink_marks(text), text
    assert all(text[:m.start()].endswith("&#8288;") for m in re.finditer("@", text)), text


@pytest.mark.parametrize("value", EMPHASIS)
def test_no_emphasis_or_strikethrough_delimiter_is_left_live(value):
    text = md_text(value)
    assert not unescaped_stars_or_tildes(text) and not live_underscores(text), text


ALPHABET = "_*~@:/.wW ab1é\\`[]&<>(|\n#-"


def random_values(seed: int, count: int = 5000) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 10))) for _ in range(count)]


def test_md_text_changes_exactly_what_unsafe_finds_and_leaves_no_delimiter_or_autolink_live():
    """The fast path (untrusted_names and md_text skip text _UNSAFE finds nothing in) agrees with md_text on
    every string of these characters, and what md_text writes holds no live delimiter or autolink mark."""
    for value in random_values(0):
        text = md_text(value)
        assert (text != value) == bool(common._UNSAFE.search(value)), repr(value)
        assert not unescaped_stars_or_tildes(text) and not live_underscores(text), (value, text)
        assert not live_autolink_marks(text) and "\n" not in text, (value, text)
        assert all(text[:m.start()].endswith("&#8288;") for m in re.finditer("@", text)), (value, text)


def test_raw_text_reads_md_text_back():
    """raw_text is md_text's inverse (its control characters aside: they stay spaces)."""
    for value in ORDINARY + AUTOLINKS + EMPHASIS + [v for v in random_values(2) if "\n" not in v]:
        assert common.raw_text(md_text(value)) == value, (value, md_text(value))
    assert common.raw_text(md_text("a\nb")) == "a b"


def test_untrusted_names_makes_the_new_forms_inert_in_a_frame():
    """untrusted_names skips a value _UNSAFE finds nothing in: a URL, an address or emphasis reached the
    Markdown raw through a frame's text column (failed before: the fast path let them through)."""
    frame = pd.DataFrame({"sweep": ["luo_rpe", "*x*", "me@evil.example", "www.evil.example", "https://e.example",
                                    "_x_", "cifar10_ladder40_cpu"]})
    out = common.untrusted_names(frame)["sweep"].tolist()
    assert out == ["luo_rpe", "\\*x\\*", "me&#8288;@evil.example", "www\\.evil.example", "https\\://e.example",
                   "\\_x\\_", "cifar10_ladder40_cpu"]
    ordinary = frame.iloc[[0, 6]]
    assert common.untrusted_names(ordinary) is ordinary  # ordinary names: the frame as it is


# ---------------------------------------------------------------- rendered as GitHub renders it
def gfm(markdown: str) -> str:
    return cmarkgfm.github_flavored_markdown_to_html(markdown)


def shown(rendered: str) -> str:
    """The text a reader sees: tags dropped, entities decoded, the WORD JOINER (invisible) dropped."""
    return html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace("\u2060", "").strip()


def tags(rendered: str) -> list[str]:
    return re.findall(r"<(\w+)", rendered)


def contexts(text: str) -> dict[str, tuple[str, list[str]]]:
    """Where generated Markdown puts a name, with the tags that context makes itself."""
    return {"prose": (f"x {text} y", ["p"]), "line start": (text, ["p"]), "list item": (f"- {text}: ok", ["ul", "li"]),
            "table cell": (f"| a | b |\n|---|---|\n| {text} | 1 |", ["table", "thead", "tr", "th", "th", "tbody", "tr",
                                                                    "td", "td"]),
            "emphasis": (f"_from {text} here_", ["p", "em"]), "strong": (f"**{text}** z", ["p", "strong"])}


@pytest.mark.parametrize("value", MATH)
def test_no_math_delimiter_is_left_live(value):
    """Every `$` escaped (GitHub's math runs after cmark-gfm on what it leaves as text, so cmark-gfm cannot show
    it: the check is on the source, as GitHub documents `\\$`), and the text still reads as it was."""
    text = md_text(value)
    assert not live_dollars(text), (value, text)
    assert common.raw_text(text) == value


@pytest.mark.parametrize("value", ORDINARY + AUTOLINKS + EMPHASIS + MATH + ["odd[x]", "<b>x</b>", "a & b", "`x`"])
def test_each_value_renders_as_its_text_and_nothing_more(value):
    """No link, emphasis, strikethrough or code is formed by the value in any context; the generated markup
    around it (a list, a table, emphasis) is formed as written; the reader sees the value as it was."""
    text = md_text(value)
    for where, (markdown, expected) in contexts(text).items():
        rendered = gfm(markdown)
        found = [t for t in tags(rendered) if t not in ("p",)] if where != "list item" else tags(rendered)
        want = [t for t in expected if t != "p"] if where != "list item" else expected
        assert found == want, (where, value, rendered)
        if where in ("prose", "line start"):
            assert shown(rendered) == markdown.replace(text, value).strip(), (where, value, rendered)


def test_random_values_render_as_their_text_and_nothing_more():
    """Random strings of the characters that make inline markup, in prose, rendered by cmark-gfm: only the
    paragraph, and the text as it was."""
    rng = random.Random(1)
    pieces = ["_", "__", "*", "**", "~", "~~", "a", "b1", " ", ".", ":", "/", "//", "://", "http", "https://", "www.",
              "WWW.", "w", "@", "x.com", "mailto:", "\\", "$", "[", "]", "(", ")", "&", "<", ">", "`", "!", "é", "#", "-"]
    for _ in range(3000):
        value = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        rendered = gfm(f"x {md_text(value)} y")
        assert tags(rendered) == ["p"], (value, md_text(value), rendered)
        assert shown(rendered) == f"x {value} y".strip(), (value, md_text(value), rendered)


def test_the_renderer_makes_links_and_emphasis_of_these_values_raw():
    """What md_text guards against, shown on the renderer itself: raw, each of these forms a link, emphasis or
    strikethrough; `\\@` still links (so md_text uses the WORD JOINER); intraword `_` is never emphasis."""
    for value in ("https://evil.example", "www.evil.example", "user@evil.example", "_x_", "*x*", "~~x~~", "a*b*c"):
        assert set(tags(gfm(f"x {value} y"))) - {"p"}, value
    assert tags(gfm("x user\\@evil.example y")) == ["p", "a"]  # a backslash escape does not stop an address
    assert tags(gfm("x luo_rpe cifar10_ladder40_cpu a__b y")) == ["p"]  # an intraword `_` never is emphasis


# ---------------------------------------------------------------- escaped once, not twice
def test_a_code_span_of_a_name_read_back_shows_the_name():
    assert code_span(common.raw_text(md_text("odd[x]_v1"))) == "`odd[x]_v1`"
    assert code_span(common.raw_text(md_text("a`b*c"))) == "``a`b*c``"
    if cmarkgfm is not None:
        assert "<code>odd[x]_v1</code>" in gfm(f"x {code_span(common.raw_text(md_text('odd[x]_v1')))} y")


def test_a_study_named_with_markup_is_shown_and_found_by_its_own_name(tmp_path):
    """Sources.sweeps and the `sweep` column went through untrusted_names (md_text), and exploratory put them
    in code spans and paths: `odd\\[x\\]` was printed for the folder `odd[x]`, and its declaration.json was
    looked for under `odd\\[x\\]`, so a declared study was called undeclared (failed before on both)."""
    results = tmp_path / "results"
    name = "odd[x]"
    write_sweep(results / name, name, [config_row(dataset="digits", pe="luo_rpe", seed=s) | {"test_acc": 0.5}
                                       for s in (0, 1)])
    sources = answers_sources.Sources(results)
    assert sources.train.frame["sweep"].unique().tolist() == ["odd\\[x\\]"]  # inert in the frame, as before
    assert sources.sweeps("digits") == [name]
    label = answers_wording.exploratory(sources.sweeps("digits"), results)
    assert "`odd[x]` declared no comparisons" in label and "\\[" not in label
    declaration.record(results / name, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    assert (results / name / DECLARATION_FILE).is_file()
    label = answers_wording.exploratory(sources.sweeps("digits"), results)
    assert "declared comparisons of `odd[x]`" in label
    ran = answers_validation.ran_with(sources, ("luo_scale",), "digits")
    assert "(`odd[x]`)" in ran and "\\[" not in ran, ran
    if cmarkgfm is not None:
        assert "<code>odd[x]</code>" in gfm(label), gfm(label)


def test_a_name_already_inert_is_not_escaped_again_in_prose():
    """budget_ladder's pair labels and token_scaling's backend lists are built from rows already made inert
    (untrusted_names); md_text on them again printed its escapes (`a\\\\\\[b\\\\\\]` for `a[b]`)."""
    inert = md_text("a[b]")
    check = budget_ladder.SharedEpochs(2, 8, 0.01, (f"{inert}+rope seed 1: 5 vs 10 epochs",), 0)
    text = budget_ladder.shared_epochs_text(check)
    assert f"{inert}+rope seed 1" in text and "\\\\" not in text, text
    table = pd.DataFrame({"pe": ["luo_rpe"] * 2, "attention": [inert, "favor"], "device": ["cpu"] * 2,
                          "variant": [f"{inert}+luo_rpe (dense)", "favor+luo_rpe (dense)"], "tokens": [64, 64]})
    backends = token_scaling.luo_path_backends(table, "cpu")
    assert inert in backends and "\\\\" not in backends, backends


def test_a_bench_study_folder_is_named_by_its_own_name(monkeypatch):
    """cost_section's line per bench study put the row's `sweep` (inert: `a\\`b\\[c\\]`) into a hand-made code
    span: its backslashes printed, and its escaped backtick closed the span early. The folder is now a
    code_span of the name read back."""
    from types import SimpleNamespace

    facts = {"linear time": "1", "linear memory": "1", "softmax time": "2", "softmax memory": "2", "paths": {},
             "thin fits": [], "crossovers": pd.DataFrame(columns=["how", "against", "variant", "overtakes from N",
                                                                  "ratio at largest N", "largest N"])}
    monkeypatch.setattr(answers_cost, "scaling_facts", lambda sources: facts)
    monkeypatch.setattr(answers_cost, "bench_protocol", lambda folder: "one CPU")
    costs = pd.DataFrame({"sweep": md_text("a`b[c]"), "dataset": "cifar10", "qk_norm": "none",
                          "attention": ["softmax", "favor"], "pe": "ape", "redraw": "—",
                          "train x softmax+ape": [1.0, 0.5], "N": 64, "batch": 32})
    lines = answers_cost.cost_section(SimpleNamespace(results_dir=Path("results"), bench_costs=costs))
    (line,) = [x for x in lines if "each bench trial alone" in x]
    assert "model (``results/a`b[c]/``, each bench trial alone" in line, line
    if cmarkgfm is not None:
        assert "<code>results/a`b[c]/</code>" in gfm(line), gfm(line)


def test_an_included_markdown_file_forms_no_autolink_or_math():
    """report.md includes every rotinv_concentration.md found under RESULTS_DIR as Markdown (inert_markdown): it
    escaped `& < > [ ]` only, so a bare `https://...`, `www....` or e-mail address in such a file rendered as a
    live link on GitHub (failed before). Rendered by cmark-gfm: no link, and the reader sees the text as written."""
    source = ("See https://evil.example/phish, www.evil.example and me@evil.example; $x$ and $$y$$.\n\n"
              "| a | b |\n|---|---|\n| ftp://e.example/x | WWW.e.example |\n"
              "Escaped already: https\\://e.example, and after an escaped backslash: http\\\\://e.example/y\n")
    rendered = gfm(report.inert_markdown(source))
    assert "<a " not in rendered and "<table>" in rendered, rendered
    assert live_dollars(report.inert_markdown(source)) == [] and live_autolink_marks(report.inert_markdown(source)) == []
    assert "https://evil.example/phish, www.evil.example and me@evil.example; $x$ and $$y$$." in shown(rendered)
