"""FAVOR+ / Performer-ReLU against the dense normalised phi(Q) phi(K)^T average; Luo FFT == dense ==
brute force; low-rank modulation (lowrank == dense path); redraw schedule and checkpoint determinism."""
import math

import pytest
import torch

from rpevit.attention.base import LowRankModulation
from rpevit.attention import kernelized
from rpevit.attention.kernelized import FavorAttention, ReluAttention, relu_as_product
from rpevit.attention.softmax import SoftmaxAttention
from rpevit.pe.relative_bias import RelativeBias

HEADS, HEAD_DIM = 2, 8


def qkv(n=16, d=8, b=2, h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def brute_force_features(backend, x):
    """phi written from the definitions, row by row, from the backend's own projection W."""
    x = x * backend.head_dim ** -0.25
    if isinstance(backend, FavorAttention):
        w = backend.projection.double()
        return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])
    proj = x @ backend.projection.double().T if backend.uses_projection else x
    return torch.clamp(proj, min=0) + backend.eps


def dense_reference(backend, q, k, v, c=None):
    """out_i = sum_j A_ij v_j / sum_j A_ij with A = (phi(Q) phi(K)^T) * c, formed explicitly."""
    a = brute_force_features(backend, q) @ brute_force_features(backend, k).transpose(-1, -2)
    if c is not None:
        a = a * c
    return (a @ v) / a.sum(-1, keepdim=True)


def luo_brute_force_weights(table, grid):
    """c_ij = exp(b[h, y_j - y_i + H-1, x_j - x_i + W-1]) by explicit loops."""
    h, w = grid
    n = h * w
    c = torch.empty(table.shape[0], n, n, dtype=table.dtype)
    for i in range(n):
        for j in range(n):
            c[:, i, j] = torch.exp(table[:, j // w - i // w + h - 1, j % w - i % w + w - 1])
    return c


BACKENDS = [
    ("favor", {}),
    ("favor", {"feature_type": "iid"}),
    ("relu", {}),
    ("relu", {"relu_projection": "identity"}),
]


def build(name, **options):
    cls = {"favor": FavorAttention, "relu": ReluAttention}[name]
    return cls(heads=HEADS, head_dim=HEAD_DIM, layer=1, **{"num_features": 12, **options})


@pytest.mark.parametrize("name,kw", BACKENDS)
def test_linear_attention_equals_dense_definition(name, kw):
    backend = build(name, **kw)
    q, k, v = qkv()
    torch.testing.assert_close(backend(q, k, v), dense_reference(backend, q, k, v))


@pytest.mark.parametrize("name,kw", BACKENDS)
@pytest.mark.parametrize("grid", [(4, 4), (3, 5)])
def test_luo_fft_equals_dense_equals_brute_force(name, kw, grid):
    q, k, v = qkv(n=grid[0] * grid[1], seed=1)
    table = torch.randn(2, 2 * grid[0] - 1, 2 * grid[1] - 1, generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
    expected = dense_reference(build(name, **kw), q, k, v, luo_brute_force_weights(table, grid))
    for path in ("fft", "dense", "auto"):
        out = build(name, **kw)(q, k, v, RelativeBias(table, grid, path))
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name,kw", BACKENDS)
def test_luo_numerator_and_denominator_fft(name, kw):
    """The FFT sums themselves: sum_j c_ij phi(k_j) v_j^T and sum_j c_ij phi(k_j) per query."""
    from rpevit.attention.toeplitz import toeplitz_fft_matvec

    grid = (3, 5)
    backend = build(name, **kw)
    _, k, v = qkv(n=15, seed=2)
    table = torch.randn(2, 5, 9, dtype=torch.float64)
    c = luo_brute_force_weights(table, grid)
    phi_k = brute_force_features(backend, k)
    num = toeplitz_fft_matvec(torch.exp(table), torch.einsum("bhnm,bhnd->bhnmd", phi_k, v).flatten(-2), grid)
    den = toeplitz_fft_matvec(torch.exp(table), phi_k, grid)
    torch.testing.assert_close(num.unflatten(-1, (phi_k.shape[-1], -1)),
                               torch.einsum("hij,bhjm,bhjd->bhimd", c, phi_k, v))
    torch.testing.assert_close(den, torch.einsum("hij,bhjm->bhim", c, phi_k))


def random_low_rank(n, rank=3, batched=False, seed=5, path="lowrank"):
    g = torch.Generator().manual_seed(seed)
    shape = (2, 2, n, rank) if batched else (2, n, rank)
    return LowRankModulation(torch.rand(*shape, generator=g, dtype=torch.float64),
                             torch.rand(*shape, generator=g, dtype=torch.float64), path)


@pytest.mark.parametrize("name,kw", BACKENDS)
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("path", ["lowrank", "dense"])
def test_low_rank_modulation_kernelized(name, kw, batched, path):
    """Both paths of a low-rank c against the explicit (phi(Q) phi(K)^T) * c, c summed by brute force."""
    backend = build(name, **kw)
    q, k, v = qkv()
    mod = random_low_rank(16, batched=batched, path=path)
    c = sum(mod.f[..., :, None, l] * mod.g[..., None, :, l] for l in range(mod.f.shape[-1]))
    torch.testing.assert_close(backend(q, k, v, mod), dense_reference(backend, q, k, v, c), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,kw", BACKENDS)
def test_low_rank_paths_equal_with_gradients(name, kw):
    """The dense path is the low-rank path's function: equal outputs and equal gradients for q, k, v, f, g."""
    q, k, v = qkv(seed=4)
    grads = []
    for path in ("lowrank", "dense"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        mod = random_low_rank(16, rank=4, path=path)
        mod.f.requires_grad_(), mod.g.requires_grad_()
        out = build(name, **kw)(*leaves, mod)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads.append([out.detach(), *(t.grad for t in (*leaves, mod.f, mod.g))])
    for lowrank, dense in zip(*grads):
        torch.testing.assert_close(dense, lowrank, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("batched", [False, True])
def test_low_rank_modulation_softmax_exact(batched):
    q, k, v = qkv()
    mod = random_low_rank(16, batched=batched)
    mod.f[..., 0, :] = 0.0  # a row of c that is zero except through other l: log c would be -inf
    mod.f[..., 0, 1] = 1.0
    weights = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])) * mod.dense()
    expected = weights @ v / weights.sum(-1, keepdim=True)
    torch.testing.assert_close(SoftmaxAttention(heads=HEADS, head_dim=HEAD_DIM)(q, k, v, mod), expected)


def test_softmax_luo_equals_definition():
    grid = (3, 5)
    q, k, v = qkv(n=15)
    table = torch.randn(2, 5, 9, dtype=torch.float64)
    weights = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(8)) * luo_brute_force_weights(table, grid)
    out = SoftmaxAttention(heads=HEADS, head_dim=HEAD_DIM)(q, k, v, RelativeBias(table, grid))
    torch.testing.assert_close(out, weights @ v / weights.sum(-1, keepdim=True))


def test_stabilizers_cancel_with_large_inputs():
    """Inputs whose exp would overflow without the max subtraction still give the exact ratio."""
    backend = build("favor")
    q, k, v = qkv(seed=4)
    q, k = q * 6, k * 6
    out = backend(q.float(), k.float(), v.float())
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), dense_reference(backend, q, k, v), rtol=1e-3, atol=1e-4)


def test_projection_is_persistent_fixed_in_eval_and_redrawn_in_training():
    backend = build("favor", redraw_interval=2)
    q, k, v = qkv()
    assert {"projection", "forward_count"} <= set(backend.state_dict())
    w0 = backend.projection.clone()
    backend.eval()
    for _ in range(5):
        backend(q, k, v)
    assert torch.equal(backend.projection, w0) and int(backend.forward_count) == 0
    backend.train()
    for _ in range(3):
        backend(q, k, v)
    assert torch.equal(backend.projection, w0)  # the forward never redraws: the trainer's step does
    step(backend, q, k, v), step(backend, q, k, v)
    assert torch.equal(backend.projection, w0)  # steps 0 and 1 use draw 0
    step(backend, q, k, v)
    w1 = backend.projection.clone()
    assert not torch.equal(w1, w0)  # step 2 uses draw 1
    never = build("favor", redraw_interval=0)
    for _ in range(4):
        step(never, q, k, v)
    assert torch.equal(never.projection, w0)


def step(backend, q, k, v):
    """One training step as the train task runs it: advance (redraw where due), then the forward."""
    backend.advance_step()
    return backend(q, k, v)


def test_redraw_is_deterministic_and_resumes_from_checkpoint():
    q, k, v = qkv()
    run = build("favor", redraw_interval=3)
    for _ in range(5):
        step(run, q, k, v)
    checkpoint = {key: t.clone() for key, t in run.state_dict().items()}
    later = [step(run, q, k, v) for _ in range(4)]
    resumed = build("favor", redraw_interval=3)  # fresh: count 0, draw 0; the load restores both
    resumed.load_state_dict(checkpoint)
    for a in later:
        torch.testing.assert_close(step(resumed, q, k, v), a, rtol=0, atol=0)
    assert torch.equal(resumed.projection, run.projection)


def test_projection_distinct_per_layer_and_seed_and_orthogonal_blocks():
    def projection(layer, seed=0):
        return FavorAttention(heads=HEADS, head_dim=HEAD_DIM, num_features=20, layer=layer, seed=seed).projection

    w = [projection(i) for i in range(3)]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    assert torch.equal(projection(1), w[1])
    assert not torch.equal(projection(0, seed=1), w[0])
    block = w[0][:8].double()
    gram = block @ block.T
    torch.testing.assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros(8, 8, dtype=torch.float64),
                               atol=1e-5, rtol=0)


def test_relu_identity_has_no_projection_and_eps_positive():
    backend = build("relu", relu_projection="identity", kernel_eps=0.01)
    assert "projection" not in backend.state_dict()
    q, k, v = qkv()
    q, k = -q.abs(), -k.abs()  # every ReLU is zero: only eps keeps the normaliser positive
    torch.testing.assert_close(backend(q, k, v), v.mean(dim=-2, keepdim=True).expand_as(v))


def test_relu_as_a_product_is_torch_relu_in_value_and_gradient():
    """x * 1[x > 0] against torch.relu: the same values and gradients (exact, float32), zeros included and
    with the gradient arriving transposed, as linear attention hands it back."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 17, 8, generator=g).round(decimals=1)  # rounding makes exact zeros
    assert (x == 0).any()
    upstream = torch.randn(2, 3, 8, 17, generator=g).transpose(-1, -2)
    grads = []
    for relu in (torch.relu, relu_as_product):
        leaf = x.clone().requires_grad_()
        out = relu(leaf)
        out.backward(upstream)
        grads.append((out.detach(), leaf.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("relu_projection", ["random", "identity"])
def test_performer_relu_equals_its_torch_relu_form_exactly(monkeypatch, relu_projection):
    """The layer's output and input gradients are what they were with torch.relu (float32, exact): the
    product form is a speed change only."""
    q, k, v = (t.float().requires_grad_() for t in qkv(n=20, d=HEAD_DIM))
    results = []
    for relu in (relu_as_product, torch.relu):
        monkeypatch.setattr(kernelized, "relu_as_product", relu)
        backend = build("relu", relu_projection=relu_projection).float()
        out = backend(q, k, v)
        results.append((out.detach(), *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for ours, reference in zip(*results):
        assert torch.equal(ours, reference)


def test_auto_luo_path_switches_to_fft_at_the_measured_crossover(monkeypatch):
    from rpevit.pe import relative_bias

    calls = []
    original = relative_bias.toeplitz_fft_matvec
    monkeypatch.setattr(relative_bias, "toeplitz_fft_matvec", lambda *a: calls.append(a[1].shape[2]) or original(*a))
    monkeypatch.setattr(relative_bias, "crossover_table", lambda: {"cpu": {"fft_from_tokens": 16,
                                                                           "measured_tokens": [4, 16, 64]}})
    backend = build("favor")
    for grid in [(3, 5), (4, 4)]:
        q, k, v = qkv(n=grid[0] * grid[1])
        backend(q, k, v, RelativeBias(torch.zeros(2, 2 * grid[0] - 1, 2 * grid[1] - 1, dtype=torch.float64), grid))
    assert calls == [16]  # 15 tokens: dense; 16 tokens: fft


def test_auto_luo_path_rules_without_a_measured_crossing(monkeypatch):
    from rpevit.pe import relative_bias

    monkeypatch.setattr(relative_bias, "crossover_table", lambda: {"cpu": {"fft_from_tokens": None,
                                                                           "measured_tokens": [64, 1024]}})
    auto = relative_bias.auto_luo_path
    assert [auto(n, "cpu") for n in (64, 1024, 1025)] == ["dense", "dense", "fft"]  # beyond the measurements: fft
    fallback = relative_bias.LUO_FFT_MIN_TOKENS  # a device kind the table lacks
    assert [auto(n, "cuda") for n in (fallback - 1, fallback)] == ["dense", "fft"]


def test_the_committed_crossover_table_is_well_formed():
    from rpevit.pe import relative_bias

    table = relative_bias.crossover_table()
    assert "cpu" in table, table  # committed from results/token_scaling_cpu
    for kind, entry in table.items():
        assert kind in ("cpu", "cuda"), kind
        n, dense, fft = entry["measured_tokens"], entry["dense_ms_per_image"], entry["fft_ms_per_image"]
        assert len(n) >= 2 and n == sorted(set(n)) and len(n) == len(dense) == len(fft), entry
        assert all(t > 0 for t in dense + fft), entry
        fft_wins = [f < d for d, f in zip(dense, fft)]
        start = entry["fft_from_tokens"]
        # the writer's rule (token_scaling.luo_path_table): `start` is the smallest measured N from which FFT is
        # faster at every larger measured N; null where dense was at least as fast at the largest N
        if start is None:
            assert not fft_wins[-1], (kind, n, fft_wins)
            expected = ["dense"] * len(n)
        else:
            i = n.index(start) if start in n else None
            assert i is not None and all(fft_wins[i:]) and (i == 0 or not fft_wins[i - 1]), (kind, start, n, fft_wins)
            expected = ["fft" if t >= start else "dense" for t in n]
        # and `luo_path: auto` takes dense below `start` and FFT from it on (dense throughout the measured N if null)
        assert [relative_bias.auto_luo_path(t, kind) for t in n] == expected


# -- the redraw schedule without a device sync --------------------------------------------------

def test_advancing_a_step_reads_nothing_back_from_the_device():
    """`int(forward_count)` was a device-to-host sync per layer per step (27 per fused CIFAR step on a
    GPU): the schedule is decided on the host copy, and the buffer is only written."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    backend = build("favor", redraw_interval=2).train()
    with Ops() as ops:
        for _ in range(5):  # steps 0-4, redraws at 2 and 4
            backend.advance_step()
    assert not [n for n in ops.names if "_local_scalar_dense" in n or n.startswith("item")], sorted(set(ops.names))
    assert int(backend.forward_count) == backend.steps_started == 5


def reference_draws(steps: int, interval: int, until: float, total: int | None) -> list[int]:
    """The draw in use at each training step, by the rule as the buffer-reading code applied it."""
    draws, current = [], 0
    for count in range(steps):
        frozen = total is not None and count >= until * total
        if count > 0 and count % interval == 0 and not frozen:
            current = count // interval
        draws.append(current)
    return draws


@pytest.mark.parametrize("interval,until,total", [(3, 0.8, 20), (1, 0.5, 10), (4, 0.8, None)])
def test_same_draws_at_the_same_steps_across_a_checkpoint(interval, until, total):
    """The projection in use at every step is the rule's draw, and a module loaded from a checkpoint
    taken mid-run (a fresh module: host copy 0) continues on exactly the same schedule."""
    def fresh():
        backend = build("favor", redraw_interval=interval, redraw_until=until).train()
        backend.total_steps = total
        return backend

    expected = reference_draws(20, interval, until, total)
    run = fresh()
    seen = []
    for t in range(20):
        run.advance_step()
        seen.append(run.projection.clone())
        if t == 8:
            saved = {key: value.clone() for key, value in run.state_dict().items()}
    for t, draw in enumerate(expected):
        assert torch.equal(seen[t], run.draw_projection(draw)), (t, draw)
    resumed = fresh()
    resumed.load_state_dict(saved)
    assert resumed.steps_started == 9
    for t in range(9, 20):
        resumed.advance_step()
        assert torch.equal(resumed.projection, seen[t]), t
    assert int(resumed.forward_count) == 20
