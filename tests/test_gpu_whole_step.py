"""`compile: graph` on a real CUDA device (skipped without one; the GPU lease runs these with tests/test_gpu.py).

What the CPU suite cannot show: that the whole step, compiled by Inductor with CUDA graphs
(`mode="reduce-overhead"`), replays correctly: every replay reads the epoch's tables, the parameters,
AdamW's state and the random-feature projections at their captured addresses and writes them back in
place, so a redraw copied into a projection, a new epoch's draws copied into the tables and the step
count all reach the graph. Checked in float64 against the stacked step (tests/test_whole_step.py's
whole_step_against_stacked: two epochs, full and short (padded) batches, so the graph is replayed several
times), and, under bf16 as a sweep runs it, that a fused group trains through the train task with
the compiled path (no eager fallback) and lands near the eager fused group's accuracy.
"""
from __future__ import annotations

import pytest
import torch

from rpevit.config import TrialConfig
from tests.test_whole_step import whole_step_against_stacked

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
              # a whole-step compile took 128 s alone on the H100 (2026-11-27); six at once on a lease take longer
              # than the lease's 150-s default per test, and the lease's own end cuts a run that is too long
              pytest.mark.timeout(300)]


def cudagraph_skips() -> dict[str, int]:
    """Inductor's reasons for running a compiled graph without CUDA graphs (a non-static input, a CPU tensor,
    ...), counted since the last counters.clear(): "compiled and did not fall back" says nothing of them."""
    from torch._dynamo.utils import counters

    return {key: n for key, n in counters["inductor"].items() if "cudagraph_skip" in key and n}


@pytest.fixture(autouse=True)
def _fresh_counters():
    from torch._dynamo.utils import counters

    counters.clear()


@pytest.mark.slow
@pytest.mark.parametrize("attention,pe", [("favor", "rope"), ("softmax", "luo_rpe"), ("relu", "circulant_string"),
                                          ("favor", "ape")])
def test_the_whole_step_under_cuda_graphs_equals_the_stacked_step_in_float64(attention: str, pe: str) -> None:
    whole = whole_step_against_stacked(torch.device("cuda"), "inductor", attention=attention, pe=pe)
    assert whole.graph.fn is not whole.graph.eager  # compiled, and it did not fall back (checked inside)
    assert cudagraph_skips() == {}  # and replayed as CUDA graphs, not run as plain compiled kernels


@pytest.mark.slow
@pytest.mark.parametrize("attention,pe", [("favor", "luo_rpe"), ("softmax", "rope")])
def test_a_fused_group_trains_with_the_whole_step_graph_under_bf16(attention: str, pe: str) -> None:
    from rpevit.tasks.train_group import train_group

    run = {"dataset": "digits", "dim": 32, "depth": 2, "heads": 2, "epochs": 3, "device": "cuda", "amp": "bf16",
           "attention": attention, "pe": pe, "eval_draws": 2}
    graph = train_group([TrialConfig.from_dict({**run, "compile": "graph", "seed": s}) for s in range(3)], log=None)
    assert cudagraph_skips() == {}
    eager = train_group([TrialConfig.from_dict({**run, "compile": "off", "seed": s}) for s in range(3)], log=None)
    assert all(isinstance(r, dict) for r in graph + eager), (graph, eager)
    assert all(r["compile_fallback"] == "" for r in graph), [r["compile_fallback"] for r in graph]
    mean = lambda rows: sum(r["test_acc"] for r in rows) / len(rows)  # noqa: E731
    # another random stream (drawn per epoch), so not equal: the same training, within seed noise
    assert mean(graph) > 0.5 and abs(mean(graph) - mean(eager)) < 0.1, (mean(graph), mean(eager))
