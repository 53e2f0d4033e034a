""""Adding a variant is one file", shown for each hook kind: a throwaway encoding of each kind is
written to a single file outside the package, imported, and then runs with every backend through
the config, the model and the attention-fidelity metric, with no other file touched."""
import importlib.util
import sys
import textwrap

import pytest
import torch

from rpevit import registry
from rpevit.config import TrialConfig
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


@pytest.fixture
def throwaway(tmp_path):
    """Import the one file (it registers itself); restore the registries afterwards."""
    saved = dict(registry.POSITION_ENCODINGS)
    path = tmp_path / "throwaway_encodings.py"
    path.write_text(THROWAWAY)
    spec = importlib.util.spec_from_file_location("throwaway_encodings", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    registry.POSITION_ENCODINGS.clear()
    registry.POSITION_ENCODINGS.update(saved)
    sys.modules.pop(spec.name, None)


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
