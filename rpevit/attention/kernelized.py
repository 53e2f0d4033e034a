"""Linear-time kernelized attention: FAVOR+ (`favor`) and Performer-ReLU (`relu`).

Both compute out_i = sum_j A_ij v_j / sum_j A_ij with A_ij = phi(q_i)^T phi(k_j) c_ij, in
O(N m d) without forming A (design: docs/random_features.md). A score-hook modulation c_ij applies
itself to the linear-attention primitive (`Modulation.linear_attention`): Luo et al.'s bias with
block-Toeplitz FFT sums (rpevit/pe/relative_bias.py), a low-rank c as feature tensor products.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from rpevit.attention.base import Modulation, RandomFeatureBackend, linear_attention, normalize_rows
from rpevit.attention.features import iid_gaussian, orthogonal_gaussian, positive_random_features
from rpevit.registry import Option, register_attention

# the options of every kernelized backend (KernelizedAttention.__init__); a subclass names them in its `options`
NUM_FEATURES = Option("num_features", int, 64, "m, random features of FAVOR+ / ReLU", ge=1, le=65536)
FEATURE_TYPE = Option("feature_type", str, "orthogonal", "random projection rows: orthogonal blocks or iid Gaussian",
                      choices=("orthogonal", "iid"))
KERNELIZED_OPTIONS = (NUM_FEATURES, FEATURE_TYPE)
RELU_PROJECTION = Option("relu_projection", str, "random", "Performer-ReLU features: ReLU(W x) with random W, or "
                         "ReLU(x)", choices=("random", "identity"))
KERNEL_EPS = Option("kernel_eps", float, 1e-3, "eps added to Performer-ReLU features", gt=0, cost_free=True)


def projection_seed(seed: int, layer: int, draw: int, salt: int = 0) -> int:
    """A well-mixed 63-bit seed from (trial seed, layer, redraw count): reproducible across processes."""
    state = np.random.SeedSequence([seed, layer + 1, draw, salt]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


class KernelizedAttention(RandomFeatureBackend):
    """The shared core: features phi(q d^-1/4), phi(k d^-1/4), then linear attention with modulation.

    Subclasses define `feature_map(x, is_query) -> (b h n m)`.

    Random projections are a persistent buffer drawn from (seed, layer, redraw count), so eval
    and checkpoint resume reuse exactly the same matrix; during training they are redrawn every
    `redraw_interval` training steps (0: never), counted by the persistent `forward_count`, but
    only during the first `redraw_until` of the training steps once the train task has set
    `total_steps` (`set_training_length`): a redraw in the last stretch of a cosine schedule
    leaves a draw the weights never adapted to, and that draw is the one evaluated.

    The trainer advances the count once per training step, before the forward
    (`advance_random_features`), not the forward itself: reading the count is a host
    synchronisation and a data-dependent branch, which a compiled step must not contain and a
    vmapped step (fused seed groups) cannot contain. The forward only reads the buffer.
    The schedule is decided on `steps_started`, a host copy of the count kept beside it (set from
    the buffer when a state dict is loaded), so a step reads nothing back from the device: on a GPU
    `int(forward_count)` waited for the previous step to finish, once per layer per step.

    Projections are drawn in float64 and stored in the dtype the layer was built in (the trial's
    `dtype`), so a float64 run's draws are not float32 draws cast up.
    """

    linear_time = True
    uses_projection = True

    def __init__(self, *, seed: int = 0, num_features: int = NUM_FEATURES.default,
                 feature_type: str = FEATURE_TYPE.default, redraw_interval: int = 1, redraw_until: float = 0.8,
                 **context: Any) -> None:
        super().__init__(**context)
        # defaults: what the default config (digits) resolves to; -1 is a config's "the dataset's recipe"
        if redraw_interval < 0:
            raise ValueError(f"redraw_interval has value {redraw_interval!r}; allowed: 0 (one draw) or a number of "
                             f"steps (-1 is a config's 'the dataset's recipe', resolved by TrialConfig.resolved() "
                             f"before a layer is built)")
        self.seed = seed
        self.num_features = num_features
        self.feature_type = feature_type
        self.redraw_interval = redraw_interval
        self.redraw_until = redraw_until
        self.total_steps: int | None = None  # set by the train task; None: redraw for ever
        self.register_buffer("forward_count", torch.zeros((), dtype=torch.long))
        self.steps_started = 0  # host copy of forward_count: the schedule reads it without a device sync
        if self.uses_projection:
            self.register_buffer("projection", self.draw_projection(0).to(torch.get_default_dtype()))

    @property
    def random_features(self) -> bool:
        return self.uses_projection

    @classmethod
    def draws_random_features(cls, config: Mapping[str, Any]) -> bool:
        return cls.uses_projection

    def draw_projection(self, draw: int, salt: int = 0) -> Tensor:
        """(m, d) Gaussian rows (orthogonal blocks or iid), reproducible from (seed, layer, draw, salt).

        salt 0: the training draws; other salts: the fresh draws of the draw-aware evaluation.
        """
        generator = torch.Generator().manual_seed(projection_seed(self.seed, self.layer, draw, salt))
        sample = orthogonal_gaussian if self.feature_type == "orthogonal" else iid_gaussian
        dtype = self.projection.dtype if hasattr(self, "projection") else torch.float64
        return sample(self.num_features, self.head_dim, generator=generator, dtype=dtype)

    def use_draw(self, projection: Tensor) -> None:
        """Replace the current projection (the draw-aware evaluation swaps draws in and back)."""
        self.projection.copy_(projection)

    def redraws_frozen(self, step: int) -> bool:
        """True from step redraw_until * total_steps on (never, while total_steps is unknown)."""
        return self.total_steps is not None and step >= self.redraw_until * self.total_steps

    def advance_step(self, count_on_device: bool = True) -> None:
        """One training step begins: redraw if this step is a redraw step, then count it (count_on_device
        False: only the host copy; the caller adds the step to `forward_count` itself, as the whole-step
        graph of `compile: graph` does inside its graph)."""
        if self.training and self.uses_projection and self.redraw_interval > 0:
            count = self.steps_started
            if count > 0 and count % self.redraw_interval == 0 and not self.redraws_frozen(count):
                draw = self.draw_projection(count // self.redraw_interval)
                if self.projection.is_cuda:  # from pinned memory the copy is queued, not waited for
                    draw = draw.pin_memory()
                self.projection.copy_(draw, non_blocking=draw.is_pinned())
            if count_on_device:
                self.forward_count += 1  # the checkpointed count, updated on the device without a sync
            self.steps_started = count + 1

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Loading a checkpoint sets the host copy of the step count too (one read per load)."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if (key := prefix + "forward_count") in state_dict:
            self.steps_started = int(state_dict[key])

    def features(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """phi(q d^-1/4), phi(k d^-1/4): (q d^-1/4)^T (k d^-1/4) = q^T k / sqrt(d)."""
        scale = self.head_dim ** -0.25
        return self.feature_map(q * scale, is_query=True), self.feature_map(k * scale, is_query=False)

    def attention_matrix(self, q: Tensor, k: Tensor, modulation: Modulation | None = None) -> Tensor:
        """A_ij proportional to phi(q_i)^T phi(k_j) c_ij, densely (the definition the fast paths compute)."""
        phi_q, phi_k = self.features(q, k)
        weights = phi_q @ phi_k.transpose(-1, -2)
        if modulation is not None:
            weights = weights * modulation.dense().to(weights.dtype)
        return normalize_rows(weights)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, modulation: Modulation | None = None) -> Tensor:
        phi_q, phi_k = self.features(q, k)
        if modulation is None:
            return linear_attention(phi_q, phi_k, v)
        return modulation.linear_attention(phi_q, phi_k, v)


@register_attention("favor", options=KERNELIZED_OPTIONS, colour="C1", order=1)
class FavorAttention(KernelizedAttention):
    """FAVOR+ (Choromanski et al. 2021): positive orthogonal random features of the softmax kernel."""

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        return positive_random_features(x, self.projection.to(x.dtype), stabilizer="query" if is_query else "key")


@register_attention("relu", options=(*KERNELIZED_OPTIONS, RELU_PROJECTION, KERNEL_EPS), colour="C2", identity_colour="C3",
                    order=2)
class ReluAttention(KernelizedAttention):
    """Performer-ReLU: phi(x) = ReLU(W x) + eps with random W, or ReLU(x) + eps (`relu_projection: identity`)."""

    def __init__(self, *, relu_projection: str = RELU_PROJECTION.default, kernel_eps: float = KERNEL_EPS.default,
                 **context: Any) -> None:
        self.uses_projection = self.projects(relu_projection)
        super().__init__(**context)
        self.eps = kernel_eps

    @staticmethod
    def projects(relu_projection: Any) -> bool:
        """ReLU(W x) draws W; ReLU(x) (`relu_projection: identity`) draws nothing. A stored row without
        the column ran with the default, random."""
        return relu_projection != "identity"

    @classmethod
    def draws_random_features(cls, config: Mapping[str, Any]) -> bool:
        return cls.projects(config.get("relu_projection"))

    def feature_map(self, x: Tensor, is_query: bool) -> Tensor:
        if self.uses_projection:
            x = x @ self.projection.to(x.dtype).T  # b h n m
        return relu_as_product(x) + self.eps


def relu_as_product(x: Tensor) -> Tensor:
    """ReLU(x) = x * 1[x > 0]: for finite x, torch.relu's value and gradient exactly (signed zeros aside: -0.0
    where ReLU gives +0.0, which adds to eps, and sums into a gradient, as +0.0 does).

    Why not torch.relu: its backward is `threshold_backward`, whose CPU kernel runs many times slower when
    the incoming gradient is transposed relative to the features, which is how linear attention's
    phi(K)^T [V, 1] hands it back; the product's backward is a multiply, which does not care
    (benchmarks/relu_forms.py; the figures are in results/compile_cpu_1thread/README.md).
    """
    return x * (x > 0).to(x.dtype)


def advance_random_features(model: torch.nn.Module) -> None:
    """Start a training step in every kernelized layer of `model` (redraws where due; see
    KernelizedAttention): call once per training step, before the forward, in train mode."""
    for module in model.modules():
        if isinstance(module, RandomFeatureBackend):
            module.advance_step()


def set_training_length(model: torch.nn.Module, total_steps: int) -> None:
    """Tell every kernelized layer how many training steps the run has (for `redraw_until`)."""
    for module in model.modules():
        if isinstance(module, KernelizedAttention):
            module.total_steps = total_steps
