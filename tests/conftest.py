"""Shared test set-up: no network, few threads, small configs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ["RPEVIT_OFFLINE"] = "1"  # no download attempts at test time
# Embedded Rays bind loopback only: Ray reads this once, at its first import, which in a test run may
# be any test module's (rpevit/sweep/session.py; run_sweep refuses an embedded Ray that is not on loopback)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# One thread on a machine of 2 cores or fewer (CI, this project's VM): the test models are tiny, so a second
# OpenMP thread gains nothing alone (1.0 s either way), and beside another busy process (a study, the other
# xdist worker) its spin-waits turned a 1-s training run into 87 s (measured 2026-11-28 on the 2-core VM, a
# 10-epoch dim-16 run, 1 vs 2 threads). Larger machines (the GPU lease's 16 cores) keep two, as rehearsed.
torch.set_num_threads(1 if (os.cpu_count() or 1) <= 2 else min(2, torch.get_num_threads()))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
DATA_DIR = Path(os.environ.get("RPEVIT_DATA", SHARED_DATA))

TINY = {"dim": 16, "depth": 1, "heads": 2, "mlp_ratio": 2.0, "train_subset": 200,
        "epochs": 2, "batch_size": 50, "eval_batch_size": 256, "drop_path": 0.0}


@pytest.fixture
def tiny() -> dict:
    """A digits config that trains in about a second."""
    return dict(TINY)


@pytest.fixture(autouse=True)
def _seeded_rngs() -> None:
    """Every test starts from the same global RNG state: statistical tolerances never flake."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def figures(monkeypatch) -> list:
    """Every figure the analysis saves, kept for inspection (saved as before)."""
    from rpevit.analysis import budget_ladder, common, efficiency, gap_closure, kernel_mse, string_study, token_scaling

    kept = []

    def keep(fig, path):
        kept.append(fig)
        return common.save_figure(fig, path)

    for module in (gap_closure.figure, efficiency.figure, string_study, kernel_mse, token_scaling, budget_ladder):
        monkeypatch.setattr(module, "save_figure", keep)
    return kept


RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


def _rays_own_auth_mode() -> str | None:
    """The auth mode Ray's loaded config holds ("token" / "disabled"); None where Ray's core is not loaded."""
    import sys

    if "ray._raylet" not in sys.modules:
        return None
    from ray._raylet import AuthenticationMode, get_authentication_mode

    return "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "disabled"


@pytest.fixture(autouse=True)
def _ray_environment_unchanged(request):
    """No test leaves Ray's auth or address variables changed behind Ray's back. A RAY_AUTH_MODE=token
    that Ray's loaded config does not share (set by rpevit's prepare_join, which runs before Ray's import,
    in a test that hid the imported Ray) makes every later embedded Ray start its GCS with token auth
    while the driver sends none: InvalidAuthToken in every Ray test after it (CI, 2026-11-27). Ray's own
    change is allowed: a local ray.init() with a token on disk sets RAY_AUTH_MODE=token and reloads its
    config with it. The leaking test fails, not those after it."""
    before = {name: os.environ.get(name) for name in RAY_ENV}
    yield
    after = {name: os.environ.get(name) for name in RAY_ENV}
    changed = {name: (before[name], after[name]) for name in RAY_ENV if before[name] != after[name]}
    if set(changed) == {"RAY_AUTH_MODE"} and after["RAY_AUTH_MODE"] == _rays_own_auth_mode():
        return  # Ray turned token auth on for its own local cluster, config and environment alike
    for name, (old, _) in changed.items():  # put back, so one leak reddens one test only
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    assert not changed, f"{request.node.nodeid} left Ray's environment changed (before, after): {changed}"


# -- running the tests in two processes (pytest-xdist, README command 2: -n 2 --dist loadgroup) --------
# Tests of these modules start no Ray, no sweep, no server and no cluster, and count no processes: they
# run beside anything. Every other module's tests form one work unit, "serial", run one at a time by one
# worker, so two Rays, clusters or sweeps never start side by side. A new module is serial until it is
# added here. Not xdist's own loadgroup: under pytest 9.2 its xdist_group markers are silently ignored
# (xdist 3.8 renames item._nodeid, which pytest 9 no longer reads: two serial tests ran side by side on
# CI, 2026-11-28), so `--dist loadgroup` gets the scheduler below instead. The GPU lease's tests run
# -n 6 with dist load on purpose, untouched by this.
BESIDE_OTHERS = frozenset({
    "test_all12_cells_check", "test_all12_variants", "test_amp_cpu", "test_analysis_budget_ladder",
    "test_analysis_common", "test_analysis_efficiency", "test_analysis_gap_closure", "test_analysis_headline",
    "test_analysis_kernel_mse", "test_analysis_report", "test_analysis_string_study", "test_analysis_token_scaling",
    "test_analysis_variants", "test_analysis_vectorised", "test_answers", "test_attention_kernelized", "test_cifar_archive",
    "test_budget_ladder", "test_checkpoint_safety", "test_compile_cpu_choice", "test_compiled_step", "test_config",
    "test_constraints", "test_data", "test_declaration", "test_declaration_integrity",
    "test_defaults_follow_validation", "test_evaluation", "test_factory", "test_features", "test_flops",
    "test_fused_group", "test_gpu_whole_step", "test_kernel_mse", "test_launch_plan", "test_lease_cifar_pack",
    "test_lease_merge_rungs", "test_lease_plan", "test_lease_rungs_space", "test_lease_summary",
    "test_lease_timeline", "test_lock", "test_metrics", "test_one_file_variants", "test_one_loop", "test_pe_cayley",
    "test_pe_circulant", "test_pe_reflection", "test_pe_relative_bias", "test_pe_rope", "test_pe_rotinv",
    "test_provenance", "test_relative_property", "test_relu_forms_benchmark", "test_results_scale_layout",
    "test_results_store", "test_results_store_sigkill", "test_rotation", "test_sparse_solve", "test_stats",
    "test_step_ops", "test_sweep_snapshot", "test_sweep_summary", "test_tensorboard", "test_toeplitz", "test_train",
    "test_training_protocol", "test_trial_dtype", "test_validation_choice", "test_variant_options",
    "test_whole_step",
})


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled in: "serial" for every test of a module not in BESIDE_OTHERS, else
    the test alone."""
    module = nodeid.split("::", 1)[0]
    return nodeid if Path(module).stem in BESIDE_OTHERS else "serial"


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (-p no:xdist, no dev extra) loads this file too
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `--dist loadgroup`: xdist's scope scheduler with the units of `work_unit` (a unit is sent
    whole to one worker)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SerialUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SerialUnitScheduling(config, log)
