""""Adding a variant is one file", shown for each hook kind: a throwaway encoding of each kind is
written to a single file outside the package, imported, and then runs with every backend through
the config, the model and the attention-fidelity metric, with no other file touched."""
import importlib.util
import sys
import textwrap
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from rpevit import registry
from rpevit.config import ConfigError, TrialConfig
from rpevit.evaluation import attention_fidelity
from rpevit.models import build_model

THROWAWAY = textwrap.dedent('''
    """Three throwaway encodings, one per hook kind, in one file."""
    import math
    from dataclasses import dataclass

    import torch
    import torch.nn.functional as F
    from torch import Tensor, nn

    from rpevit.attention.base import Modulation, linear_attention, normalize_rows
    from rpevit.pe.base import PositionEncoding
    from rpevit.registry import register_pe


    @register_pe("throwaway_sinusoid")
    class Sinusoid(PositionEncoding):
        hook = "token"

        def add_to_tokens(self, x: Tensor) -> Tensor:
            freq = torch.arange(1, self.dim + 1, dtype=x.dtype, device=x.device)
            return x + 0.02 * torch.sin(self.positions[:, :1].to(x) * freq)


    @register_pe("throwaway_rope_x")
    class RopeX(PositionEncoding):
        hook = "qk"

        def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
            angle = self.positions[:, 0:1].to(q) * 0.5  # n 1, one frequency, x only
            cos, sin = torch.cos(angle), torch.sin(angle)

            def turn(t: Tensor) -> Tensor:
                a, b = t[..., 0::2], t[..., 1::2]
                return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

            return turn(q), turn(k)


    @dataclass
    class GaussianDistance(Modulation):
        """c_ij = exp(-|r_i - r_j|^2 / (2 sigma^2)), per head; dense is fine for a throwaway."""

        log_c: Tensor  # h n n

        def dense(self) -> Tensor:
            return torch.exp(self.log_c)

        def softmax_attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.log_c.to(q.dtype))

        def linear_attention(self, phi_q: Tensor, phi_k: Tensor, v: Tensor) -> Tensor:
            weights = (phi_q @ phi_k.transpose(-1, -2)) * self.dense().to(phi_q.dtype)
            return normalize_rows(weights) @ v


    @register_pe("throwaway_gauss")
    class GaussianBias(PositionEncoding):
        hook = "score"

        def __init__(self, **context) -> None:  # grid, heads, head_dim, ...: rpevit.models.factory fills them
            super().__init__(**context)
            self.log_sigma = nn.Parameter(torch.zeros(self.heads))

        def modulation(self) -> GaussianDistance:
            sq = torch.cdist(self.positions, self.positions) ** 2
            return GaussianDistance(-sq / (2 * torch.exp(2 * self.log_sigma))[:, None, None])
''')


@contextmanager
def imported_file(tmp_path, name: str, text: str, tables: tuple[dict, ...]):
    """Write `text` to <tmp_path>/<name>.py and import it (its decorators register its variants);
    afterwards restore the registry `tables` and forget the module."""
    registry.load_all()  # the package's own names first, as in any run (and so they are restored)
    saved = [dict(t) for t in tables]
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for table, copy in zip(tables, saved):
            table.clear()
            table.update(copy)
        sys.modules.pop(spec.name, None)


@pytest.fixture
def throwaway(tmp_path):
    with imported_file(tmp_path, "throwaway_encodings", THROWAWAY, (registry.POSITION_ENCODINGS,)) as module:
        yield module


@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
def test_one_file_adds_an_encoding_of_each_hook_kind(throwaway, attention):
    registry.load_all()
    pe = "throwaway_sinusoid+throwaway_rope_x+throwaway_gauss"
    cfg = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 2,
                                 "num_features": 16, "attention": attention, "pe": pe})
    model = build_model(cfg, 1, 10)
    images = torch.randn(4, 1, 8, 8)
    loss = model(images).logsumexp(-1).mean()
    loss.backward()
    sigma = [p for n, p in model.named_parameters() if n.endswith("log_sigma")]
    assert len(sigma) == 2 and all(p.grad is not None and p.grad.abs().max() > 0 for p in sigma)
    # the backend's dense attention matrix (built from the new modulation) is what forward applies
    attn = model.attention_layers()[0]
    q, k, v, modulation = attn.attention_inputs(torch.randn(2, 16, 16))
    assert isinstance(modulation, throwaway.GaussianDistance)
    torch.testing.assert_close(attn.backend.attention_matrix(q, k, modulation) @ v,
                               attn.backend(q, k, v, modulation), atol=1e-5, rtol=1e-4)
    fidelity = attention_fidelity(model, images)
    assert len(fidelity) == 2 and (fidelity == [0.0, 0.0]) == (attention == "softmax")


THROWAWAY_BACKEND_AND_TASK = textwrap.dedent('''
    """A throwaway attention backend and a throwaway task with its own metric, in one file."""
    import torch.nn.functional as F
    from torch import Tensor

    from rpevit.attention.base import AttentionBackend, Modulation, linear_attention, normalize_rows
    from rpevit.config import TrialConfig
    from rpevit.models import build_model
    from rpevit.registry import TaskMetrics, register_attention, register_task


    @register_attention("throwaway_elu")
    class EluLinearAttention(AttentionBackend):
        """Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020)."""

        linear_time = True

        def features(self, x: Tensor) -> Tensor:
            return F.elu(x) + 1

        def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
            phi_q, phi_k = self.features(q), self.features(k)
            if modulation is None:
                return linear_attention(phi_q, phi_k, v)
            return modulation.linear_attention(phi_q, phi_k, v)

        def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
            weights = self.features(q) @ self.features(k).transpose(-1, -2)
            return normalize_rows(weights if modulation is None else weights * modulation.dense())


    @register_task("throwaway_size", TaskMetrics(headline={"weights": int}, other={"tokens_per_image": int}))
    def model_size(cfg: TrialConfig, *, checkpoint_dir=None, on_epoch=None, log=print) -> dict:
        model = build_model(cfg, 1, 10)
        return {**cfg.to_dict(), "weights": sum(p.numel() for p in model.parameters()),
                "tokens_per_image": cfg.grid[0] * cfg.grid[1]}
''')


@pytest.fixture
def throwaway_backend_and_task(tmp_path):
    tables = (registry.ATTENTIONS, registry.TASKS, registry.METRICS)
    with imported_file(tmp_path, "throwaway_backend_and_task", THROWAWAY_BACKEND_AND_TASK, tables) as module:
        yield module


@pytest.mark.parametrize("pe", ["ape", "rope", "luo_rpe", "rotinv"])
def test_one_file_adds_an_attention_backend(throwaway_backend_and_task, pe):
    cfg = TrialConfig.from_dict({"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 2,
                                 "attention": "throwaway_elu", "pe": pe})
    model = build_model(cfg, 1, 10)
    assert isinstance(model.attention_layers()[0].backend, throwaway_backend_and_task.EluLinearAttention)
    model(torch.randn(4, 1, 8, 8)).logsumexp(-1).mean().backward()
    attn = model.attention_layers()[1]
    q, k, v, modulation = attn.attention_inputs(torch.randn(2, 16, 16))
    matrix = attn.backend.attention_matrix(q, k, modulation)
    torch.testing.assert_close(matrix.sum(-1), torch.ones(matrix.shape[:-1]))
    torch.testing.assert_close(matrix @ v, attn.backend(q, k, v, modulation), atol=1e-5, rtol=1e-4)


def test_one_file_adds_a_task_whose_metrics_reach_the_cli_and_the_parquet_schema(throwaway_backend_and_task, capsys,
                                                                                  tmp_path):
    import json

    from rpevit.cli import main
    from rpevit.sweep.protocol import SUMMARY, Report
    from rpevit.sweep.results import trials_schema
    from rpevit.sweep.store import read_frame
    from rpevit.sweep.writer import ParquetResults
    from rpevit.sweep.space import expand_space

    assert main(["--task", "throwaway_size", "--dim", "16", "--heads", "2", "--quiet"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["tokens_per_image"] == 16 and row["weights"] > 0
    names = trials_schema("throwaway_size").names
    assert names.index("weights") == names.index("seed") + 1  # a headline metric follows the headline config
    space = expand_space({"name": "size", "task": "throwaway_size", "fixed": {"dim": 16, "heads": 2}}, source="t")
    writer = ParquetResults(tmp_path, "size", dict(zip(space.keys, space.trials)), {space.keys[0]: 0},
                            task="throwaway_size")
    writer.on_trial_result(0, [], SimpleNamespace(trial_id="t0"),
                           Report(SUMMARY, space.keys[0], {**row, "trial_key": space.keys[0]}).to_tune())
    table = read_frame(tmp_path)  # during the sweep: the documented reader of its parts
    assert table["weights"].dtype == "int64" and int(table["weights"].iloc[0]) == row["weights"]


# ---- the analysis reads what variants declare: an encoding's options and a backend's random draws
OPTIONED_ENCODING = textwrap.dedent('''
    """A throwaway encoding with an option another encoding declares (rope's), in one file."""
    import torch
    from torch import Tensor

    from rpevit.pe.base import PositionEncoding
    from rpevit.pe.rope import ROPE_BASE
    from rpevit.registry import register_pe


    @register_pe("throwaway_based", options=(ROPE_BASE,))
    class Based(PositionEncoding):
        hook = "token"

        def __init__(self, *, rope_base: float = ROPE_BASE.default, **context) -> None:
            super().__init__(**context)
            self.base = rope_base

        def add_to_tokens(self, x: Tensor) -> Tensor:
            return x + 0.01 * torch.sin(self.positions[:, :1].to(x) / self.base)
''')

RANDOM_FEATURE_BACKEND = textwrap.dedent('''
    """A throwaway random-feature backend (trigonometric features of the softmax kernel), in one file."""
    import torch
    from torch import Tensor

    from rpevit.attention.features import trig_random_features
    from rpevit.attention.kernelized import KERNELIZED_OPTIONS, KernelizedAttention
    from rpevit.registry import register_attention


    @register_attention("throwaway_trig", options=KERNELIZED_OPTIONS)
    class TrigAttention(KernelizedAttention):
        def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
            return trig_random_features(x, self.projection.to(x.dtype)) ** 2 + 1e-3
''')


def test_the_report_groups_a_new_encodings_options_and_judges_a_new_random_feature_backend(tmp_path):
    from rpevit.analysis import common, gap_closure
    from rpevit.attention.base import RandomFeatureBackend
    from tests.analysis_rows import config_row, write_sweep

    tables = (registry.POSITION_ENCODINGS, registry.ATTENTIONS)
    with imported_file(tmp_path, "throwaway_based", OPTIONED_ENCODING, tables), \
            imported_file(tmp_path, "throwaway_trig", RANDOM_FEATURE_BACKEND, tables):
        rows = []
        for seed in range(2):
            for attention, pe, base, acc, draw_mean in (("softmax", "throwaway_based", 50.0, 0.9, None),
                                                         ("softmax", "throwaway_based", 200.0, 0.7, None),
                                                         ("throwaway_trig", "ape", 100.0, 0.95, 0.6),
                                                         ("softmax", "ape", 100.0, 0.8, None)):
                row = {**config_row(attention=attention, pe=pe, rope_base=base, seed=seed, redraw_interval=100),
                       "test_acc": acc + seed / 100}
                if draw_mean is not None:
                    row["test_acc_draw_mean"] = draw_mean + seed / 100
                rows.append(row)
        out = write_sweep(tmp_path / "sweep", "sweep", rows)
        frame = common.load_trials(out, task="train")
        labelled = common.with_variant(frame)
        assert set(labelled["pe"]) == {"throwaway_based (rope_base=50)", "throwaway_based (rope_base=200)", "ape"}
        trig = frame["attention"] == "throwaway_trig"
        assert issubclass(registry.ATTENTIONS["throwaway_trig"], RandomFeatureBackend)
        assert common.has_random_features(frame).tolist() == trig.tolist()
        assert common.judged_accuracy(frame)[trig].round(4).tolist() == [0.6, 0.61]  # the draw mean, not test_acc
        text = gap_closure.build(out)
        assert "throwaway_based (rope_base=50)" in text and "throwaway_based (rope_base=200)" in text
        assert "| throwaway_trig | ape | none | every 100 until 0.8 | 2 |" in text


UNDECLARED_OPTION = textwrap.dedent('''
    """A throwaway encoding and backend whose __init__ take an option they do not declare."""
    from torch import Tensor

    from rpevit.attention.softmax import SoftmaxAttention
    from rpevit.pe.base import PositionEncoding
    from rpevit.registry import register_attention, register_pe


    @register_pe("throwaway_scaled")
    class Scaled(PositionEncoding):
        hook = "token"

        def __init__(self, *, throwaway_alpha: float = 0.5, **context) -> None:
            super().__init__(**context)
            self.alpha = throwaway_alpha

        def add_to_tokens(self, x: Tensor) -> Tensor:
            return x * self.alpha


    @register_attention("throwaway_tempered")
    class Tempered(SoftmaxAttention):
        def __init__(self, *, throwaway_temperature: float = 2.0, **context) -> None:
            super().__init__(**context)


    @register_pe("throwaway_borrower")
    class Borrower(PositionEncoding):
        """Takes rope's option without naming it in its own `options`."""
        hook = "token"

        def __init__(self, *, rope_base: float = 100.0, **context) -> None:
            super().__init__(**context)
''')


def test_an_undeclared_option_is_refused_at_the_dry_run(tmp_path, capsys):
    """Such a variant used to pass validation and `--dry-run`, and then fail every trial in the factory: now the
    config refuses it in one line naming the field, the value and the option to declare; so is a variant
    taking another variant's option (rope_base) without naming it in its own `options`."""
    from tests.test_dry_run import run_dry

    tables = (registry.POSITION_ENCODINGS, registry.ATTENTIONS)
    with imported_file(tmp_path, "throwaway_options", UNDECLARED_OPTION, tables):
        with pytest.raises(ConfigError, match=r"field 'pe' has value 'throwaway_scaled'; allowed: .*"
                                              r"also takes 'throwaway_alpha'; declare it as an Option of the "
                                              r"variant \(register_pe\(\.\.\., options="):
            TrialConfig(pe="ape+throwaway_scaled").validate()
        with pytest.raises(ConfigError, match=r"field 'attention' has value 'throwaway_tempered'.*"
                                              r"'throwaway_temperature'"):
            TrialConfig(attention="throwaway_tempered").validate()
        with pytest.raises(ConfigError, match=r"field 'pe' has value 'throwaway_borrower'.*also takes 'rope_base'.*"
                                              r"naming the one declaration where another variant has it "
                                              r"\('rope_base': the Option of pe '\w+'\)$"):
            TrialConfig(pe="throwaway_borrower").validate()
        space = tmp_path / "space.yaml"
        space.write_text("name: options\ntask: train\nfixed: {dataset: digits, epochs: 1}\n"
                         "grid:\n  - pe: [ape, throwaway_scaled]\nseeds: [0]\n")
        code, out, err = run_dry(capsys, "--space", str(space), "--results-dir", str(tmp_path / "out"))
        assert code == 2 and "throwaway_alpha" in err and len(err.strip().splitlines()) == 1, (code, out, err)


LEARNED_BACKEND = textwrap.dedent('''
    """A throwaway backend with one learned parameter (a temperature), and one without, in one file."""
    import torch
    from torch import nn

    from rpevit.attention.softmax import SoftmaxAttention
    from rpevit.registry import register_attention

    BUILT = []  # one entry per construction


    @register_attention("throwaway_learned")
    class Learned(SoftmaxAttention):
        def __init__(self, **context) -> None:
            super().__init__(**context)
            BUILT.append(self.layer)
            self.log_temperature = nn.Parameter(torch.zeros(()))

        def forward(self, q, k, v, modulation=None):
            return super().forward(q * self.log_temperature.exp(), k, v, modulation)


    @register_attention("throwaway_fixed")
    class Fixed(SoftmaxAttention):
        def __init__(self, **context) -> None:
            super().__init__(**context)
            BUILT.append(self.layer)
            self.register_buffer("temperature", torch.ones(()))
''')


def test_a_backend_with_learned_parameters_is_refused_at_validation_once_per_backend(tmp_path, capsys):
    """Such a backend used to pass validation and `--dry-run`, train every epoch, and then fail in the final
    evaluation (rpevit.evaluation.with_softmax_attention: 'has learned parameters'): the softmax swap would drop
    them. Now the config refuses it in one line naming the field, the value, what is allowed and why; the
    backend is built once per process for that, not once per trial, and the global RNG is left as it was."""
    from tests.test_dry_run import run_dry

    with imported_file(tmp_path, "throwaway_learned", LEARNED_BACKEND, (registry.ATTENTIONS,)) as module:
        message = (r"^config: field 'attention' has value 'throwaway_learned'; allowed: a backend without learned "
                   r"parameters: Learned has 'log_temperature'\. The final evaluation of a trained model also runs "
                   r"its weights with exact softmax attention in the backend's place \(the softmax swap")
        with pytest.raises(ConfigError, match=message):
            TrialConfig(attention="throwaway_learned").validate()
        with pytest.raises(ConfigError, match=message):
            TrialConfig.from_dict({"attention": "throwaway_learned", "seed": 3})
        space = tmp_path / "space.yaml"
        space.write_text("name: learned\ntask: train\nfixed: {dataset: digits, epochs: 1}\n"
                         "grid:\n  - attention: [softmax, throwaway_learned]\nseeds: [0]\n")
        code, out, err = run_dry(capsys, "--space", str(space), "--results-dir", str(tmp_path / "out"))
        assert code == 2 and "a backend without learned parameters" in err and len(err.strip().splitlines()) == 1, \
            (code, out, err)
        # a buffer is not a learned parameter; validating many trials builds the backend once
        module.BUILT.clear()
        state = torch.random.get_rng_state()
        for seed in range(200):
            TrialConfig.from_dict({"attention": "throwaway_fixed", "seed": seed, "epochs": 1 + seed % 3})
        assert module.BUILT == [0]
        assert torch.equal(torch.random.get_rng_state(), state)


def test_the_efficiency_figure_marks_a_new_random_feature_backend_trained_on_one_draw(tmp_path):
    """Before, the figure knew random-feature backends by name (favor, relu): a one-file one trained without
    redraws was drawn as if redrawn, unlabelled. Now the backend's class says it (RandomFeatureBackend)."""
    import pandas as pd

    from rpevit.analysis.efficiency.figure import not_redrawn, short_label

    def row(attention: str, redraw: str) -> pd.Series:
        return pd.Series({"attention": attention, "pe": "ape", "qk_norm": "none", "redraw": redraw})

    with imported_file(tmp_path, "throwaway_trig", RANDOM_FEATURE_BACKEND, (registry.ATTENTIONS,)):
        assert not_redrawn(row("throwaway_trig", "off"))
        assert short_label(row("throwaway_trig", "off")) == "throwaway_trig+ape no redraw"
        assert not not_redrawn(row("throwaway_trig", "every 100 until 0.8"))
    assert not_redrawn(row("favor", "off")) and not_redrawn(row("relu", "off"))
    assert not not_redrawn(row("softmax", "off")) and not not_redrawn(row("relu-identity", "off"))
