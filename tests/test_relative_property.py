"""The relative property of every registered q/k-hook and score-hook encoding.

Translating all positions by one offset must leave every softmax logit (q/k hooks:
(T(r_i) q)^T T(r_j) k) and every modulation weight c_ij (score hooks) unchanged. Encodings are
built once for an 8 x 8 grid; the same query/key contents are placed in two 5 x 5 windows whose
corners differ by (3, 2), and the window-restricted logits / weights are compared. Iterates over
the registry, so encodings added later are covered automatically.
"""
import pytest
import torch

from rpevit import registry
from rpevit.attention.base import Modulation
from rpevit.config import ConfigError, TrialConfig
from rpevit.models.factory import build_encodings

registry.load_all()
RELATIVE = sorted(n for n, c in registry.POSITION_ENCODINGS.items() if c.hook in ("qk", "score"))
GRID, WINDOW, SHIFT = 8, 5, (3, 2)  # shift as (dx, dy)


def test_known_encodings_are_covered():
    assert {"rope", "rope_mixed", "circulant_string", "luo_rpe"} <= set(RELATIVE)


def config_for(name: str) -> TrialConfig:
    """The first head dim (8, 16, 32, 12, 24) the encoding accepts, on cifar10's 8 x 8 patch grid."""
    for head_dim in (8, 16, 32, 12, 24):
        try:
            # luo_scale 1: the random raw table below then gives biases of a few units (digits' default 300 would
            # turn them into +-100 and every weight but one into 0; the property holds at any scale)
            return TrialConfig.from_dict(dict(dataset="cifar10", patch_size=4, heads=2, dim=2 * head_dim, pe=name,
                                              luo_scale=1.0))
        except ConfigError:
            continue
    raise AssertionError(f"no head dim in (8, 16, 32, 12, 24) suits pe {name!r}")


def build(name: str):
    cfg = config_for(name)
    (pe,) = build_encodings(cfg, ("qk", "score"), layer=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random parameters: zero-initialised tables would pass trivially
        for p in pe.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return pe


def window_tokens(corner):
    x0, y0 = corner
    return torch.tensor([(y0 + v) * GRID + (x0 + u) for v in range(WINDOW) for u in range(WINDOW)])


WINDOW_A, WINDOW_B = window_tokens((0, 0)), window_tokens(SHIFT)


@pytest.mark.parametrize("name", RELATIVE)
def test_translation_leaves_logits_or_weights_unchanged(name):
    pe = build(name)
    assert tuple(pe.grid) == (GRID, GRID)
    if pe.hook == "qk":
        g = torch.Generator().manual_seed(1)
        h, d, n = pe.heads, pe.head_dim, GRID * GRID
        content_q, content_k = torch.randn(2, 1, h, WINDOW * WINDOW, d, generator=g)
        background = torch.randn(2, 1, h, n, d, generator=g)

        def window_logits(window):  # the windows overlap: one rotate call per placement
            q, k = background.clone()
            q[:, :, window], k[:, :, window] = content_q, content_k
            rq, rk = pe.encode_qk(q, k)
            return rq[:, :, window] @ rk[:, :, window].transpose(-1, -2)

        logits = {"A": window_logits(WINDOW_A), "B": window_logits(WINDOW_B)}.get
        torch.testing.assert_close(logits("A"), logits("B"), atol=1e-4, rtol=1e-4)
        plain = content_q @ content_k.transpose(-1, -2)
        assert (logits("A") - plain).abs().max() > 1e-2, "the encoding ignores positions"
    else:
        mod = pe.modulation()
        assert isinstance(mod, Modulation)
        c = mod.dense()  # up to a per-head factor, which a relative pattern keeps
        block = lambda w: c[..., w[:, None], w[None, :]]  # noqa: E731
        torch.testing.assert_close(block(WINDOW_A), block(WINDOW_B), atol=1e-5, rtol=1e-5)
        off_diagonal = block(WINDOW_A)[..., 0, 1:]
        assert (off_diagonal.amax() - off_diagonal.amin()) > 1e-3, "the weights ignore positions"
