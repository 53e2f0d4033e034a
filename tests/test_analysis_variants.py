"""The analysis learns each backend's and encoding's name, family, groups, order and colour from what it
declares where it registers (rpevit.registry.Display), with one colour map (rpevit.analysis.variants):
a throwaway backend and encoding, each in one file, reach every figure and study with no analysis file
touched (issue 44, item 3)."""
from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba

from rpevit import registry
from rpevit.analysis import budget_ladder, common, efficiency, gap_closure, string_study, token_scaling
from tests.analysis_rows import config_row, train_rows, write_sweep
from tests.test_one_file_variants import imported_file

PLAIN_BACKEND = textwrap.dedent('''
    """A throwaway backend that declares nothing of how it is shown."""
    from rpevit.attention.softmax import SoftmaxAttention
    from rpevit.registry import register_attention


    @register_attention("throwaway_plain")
    class Plain(SoftmaxAttention):
        pass
''')

DECLARED = textwrap.dedent('''
    """A throwaway backend and encoding that declare their label, colour, family, groups and order."""
    from rpevit.attention.softmax import SoftmaxAttention
    from rpevit.pe.rope import ROPE_BASE, AxialRoPE
    from rpevit.registry import register_attention, register_pe


    @register_attention("throwaway_shown", label="shown attention", colour="#123456", order=-1)
    class Shown(SoftmaxAttention):
        pass


    @register_pe("throwaway_string", options=(ROPE_BASE,), label="throwaway STRING", colour="tab:olive", family="throwaway family",
                 groups=("string",), order=50)
    class ThrowawayString(AxialRoPE):
        pass
''')
TABLES = (registry.ATTENTIONS, registry.POSITION_ENCODINGS)


def rgba(colour) -> tuple:
    return tuple(np.round(to_rgba(colour), 6))


def cost_rows(attention: str, pe: str = "ape") -> list[dict]:
    """train rows of train_rows()'s softmax+ape and favor+ape, and the same three seeds under `attention`+`pe`."""
    rows = [r for r in train_rows() if r["pe"] == "ape" and r["attention"] in ("softmax", "favor")]
    return rows + [{**config_row(attention=attention, pe=pe, seed=seed, dataset="digits"), "test_acc": 0.85 + seed / 100,
                    "train_s_per_epoch": 1.2, "flops": 0.9e6, "infer_ms_per_sample": 0.1, "params": 1000, "aic": 1.0,
                    "bic": 2.0} for seed in range(3)]


def pareto_figure(tmp_path, figures, rows: list[dict]):
    write_sweep(tmp_path / "main", "main", rows)
    efficiency.plot_pareto(efficiency.variant_costs(common.load_trials(tmp_path, "train")), tmp_path / "pareto.png")
    return figures[-1]


def legend_colours(fig) -> dict[str, tuple]:
    """Legend label -> the colour of its marker (attention entries are round markers)."""
    legend = fig.legends[0]
    return {text.get_text(): rgba(handle.get_color()) for text, handle in zip(legend.get_texts(), legend.legend_handles)
            if handle.get_marker() == "o"}


def test_every_drawn_backend_colour_has_a_legend_entry_even_for_a_backend_that_declares_none(tmp_path, figures):
    """Before: efficiency drew a backend missing from its own colour list in 'C4' and named it nowhere."""
    with imported_file(tmp_path, "throwaway_plain", PLAIN_BACKEND, TABLES):
        fig = pareto_figure(tmp_path, figures, cost_rows("throwaway_plain"))
        named = legend_colours(fig)
        assert "throwaway_plain" in named, named
        drawn = {rgba(colour) for ax in fig.axes for points in ax.collections
                 if isinstance(points, PathCollection) and points.get_sizes()[0] < 100  # markers, not the front's rings
                 for colour in points.get_edgecolor() if rgba(colour) != rgba("k")}
        assert drawn and drawn <= set(named.values()), (drawn, named)


def test_a_declared_backend_and_encoding_reach_every_figure_and_study(tmp_path, figures):
    from rpevit.analysis import variants

    with imported_file(tmp_path, "throwaway_declared", DECLARED, TABLES):
        # the colour map, the legend name and order
        assert variants.colour(variants.ATTENTION, "throwaway_shown") == "#123456"
        assert variants.colour(variants.PE, "throwaway_string") == "tab:olive"
        assert variants.label(variants.PE, "throwaway_string") == "throwaway STRING"
        assert variants.ordered(variants.ATTENTION, ["softmax", "throwaway_shown", "favor"])[0] == "throwaway_shown"
        # efficiency: its own colour and label, first in the legend (order -1)
        fig = pareto_figure(tmp_path / "eff", figures, cost_rows("throwaway_shown", "throwaway_string"))
        named = legend_colours(fig)
        assert list(named)[0] == "shown attention" and named["shown attention"] == rgba("#123456")
        # token scaling: a panel for its family; timed against softmax+rope, as the STRINGs are
        assert token_scaling.counterpart("favor", "throwaway_string", "exact") == "softmax+rope"
        table = pd.DataFrame([{"device": "cpu", "variant": f"{a}+{pe}", "tokens": n, "attention": a, "pe": pe,
                               "out_of_memory": False, token_scaling.TIME: n * k, token_scaling.MEMORY: n}
                              for a, pe, k in (("softmax", "rope", 2.0), ("throwaway_shown", "throwaway_string", 1.0))
                              for n in (16, 64)])
        token_scaling.plot(table, tmp_path / "scaling.png")
        top = {ax.get_title(): ax for ax in figures[-1].axes[:2]}
        assert set(top) == {"rope and circulant\ncpu", "throwaway family"}
        lines = {line.get_label(): rgba(line.get_color()) for line in top["throwaway family"].get_lines()}
        assert lines == {"throwaway_shown+throwaway_string": rgba("#123456")}
        # the STRING study: its rows are among the study's, beside rope
        rows = [{**config_row(pe=pe, seed=seed, dataset="digits"), "test_acc": 0.9}
                for pe in ("rope", "throwaway_string", "ape") for seed in range(2)]
        write_sweep(tmp_path / "string", "string", rows)
        studied = string_study.string_rows(common.load_trials(tmp_path / "string", "train"))
        assert set(studied["pe"]) == {"rope", "throwaway_string"}
        assert "throwaway_string" in string_study.string_pes()
    assert "throwaway_string" not in string_study.string_pes()  # gone with its registration


def bar_colours(fig) -> dict[str, tuple]:
    legend = fig.legends[0]
    return {text.get_text(): rgba(handle.get_facecolor()) for text, handle in zip(legend.get_texts(),
                                                                                 legend.legend_handles)}


def test_an_encoding_has_one_colour_in_every_figure_whatever_else_is_drawn(tmp_path, figures):
    """Before: gap_closure and budget_ladder coloured encodings by their place among those drawn, so rope was
    C0 in one figure and C2 in another."""
    rows = train_rows() + [{**r, "pe": "luo_rpe", "test_acc": r["test_acc"] + 0.01} for r in train_rows()
                           if r["attention"] == "favor" and r["pe"] == "rope"]
    write_sweep(tmp_path / "gap", "gap", rows)
    gap_closure.build(tmp_path / "gap")
    gap = bar_colours(figures[-1])
    ladder = budget_ladder.per_budget(budget_ladder.ladder_rows(pd.DataFrame(
        [{**config_row(pe=pe, seed=seed, epochs=epochs, dataset="digits"), "test_acc": 0.5 + epochs / 100,
          "n_train": 100} for pe in ("ape", "cayley_string", "rope") for seed in range(2) for epochs in (1, 2)])))
    budget_ladder.plot(ladder, tmp_path / "ladder.png", "cpu")
    handles, labels = figures[-1].axes[0].get_legend_handles_labels()  # errorbar containers: [0] is the line
    lines = {label: rgba(handle[0].get_color()) for handle, label in zip(handles, labels)}
    assert gap["rope"] == lines["softmax+rope"], (gap, lines)
    from rpevit.analysis import variants

    assert gap["rope"] == rgba(variants.colour(variants.PE, "rope"))
    assert gap["luo_rpe"] == rgba(variants.colour(variants.PE, "luo_rpe")) != gap["rope"]
    assert lines["softmax+cayley_string"] == rgba(variants.colour(variants.PE, "cayley_string"))


def test_every_registered_variant_declares_a_distinct_readable_colour_and_the_fallbacks_are_apart():
    from rpevit.analysis import variants

    for kind, table in (("attention", registry.ATTENTIONS), ("pe", registry.POSITION_ENCODINGS)):
        variants.display(kind, "softmax")  # loads the registry
        declared = [variants.declared_colour(kind, name) for name in table]
        assert None not in declared, dict(zip(table, declared))
        assert len({rgba(c) for c in declared}) == len(declared), dict(zip(table, declared))
    tab10 = {rgba(f"C{i}") for i in range(10)}
    assert not {rgba(c) for c in variants.FALLBACK} & tab10
    assert variants.colour("attention", "relu-identity") == "C3"  # its backend's identity_colour


def test_undeclared_names_of_one_figure_never_share_a_colour_and_keep_theirs_alone():
    from rpevit.analysis import variants

    names = [f"ape+x{i}" for i in range(len(variants.FALLBACK))]
    together = variants.colours(variants.PE, [*names, "rope"])
    assert len(set(together.values())) == len(names) + 1 and together["rope"] == "C2"
    alone = {name: variants.colour(variants.PE, name) for name in names}
    assert alone == {name: variants.fallback_colour(variants.PE, name) for name in names}
    # the same in every process and release: CRC-32 of "pe:<name>" mod 5 picks these (computed once, pinned;
    # a process-salted hash() or another hash would move them)
    pinned = {"ape+x0": "darkgoldenrod", "ape+x1": "navy", "ape+x2": "darkgoldenrod"}
    assert {name: variants.fallback_colour(variants.PE, name) for name in pinned} == pinned
    assert {name: variants.colour(variants.PE, name) for name in pinned} == pinned


@pytest.mark.parametrize("field, value", [("colour", ""), ("order", "1"), ("groups", "string"), ("label", 3)])
def test_a_bad_declaration_is_refused_in_one_line_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"variant 'x': {field} = {value!r}; allowed"):
        registry.register_pe("x", **{field: value})
