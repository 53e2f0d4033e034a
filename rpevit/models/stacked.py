"""k models of one architecture trained as one: stacked parameters and one vmapped forward.

Why: a small ViT's training step is a few hundred tiny kernels, so one trial leaves a GPU waiting
on launches (docs/fused_groups.md). Stacking the parameters of k members along a new leading
dimension and running the forward under `torch.func.vmap` turns every kernel into one k times
larger (HFTA, Wang et al. 2021; PyTorch's model-ensembling recipe), with the members still
independent: vmap keeps each member's arithmetic separate, gradients of the summed losses are each
member's own, and AdamW is elementwise, so one optimizer over the stacked tensors is k optimizers.

Each member stays an ordinary nn.Module whose parameters and buffers are *views* into the stacked
tensors. Whatever works on one model works on a member unchanged, and writes through: loading its
checkpoint, swapping random-feature draws, redrawing them, evaluating it, saving its state_dict.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel


def vmap_blockers(model: nn.Module) -> list[str]:
    """Why `model` cannot run under vmap (empty if it can): modules that declare `vmap_blocker`,
    e.g. the sparse CG Cayley solve (sparse tensors and a data-dependent iteration count)."""
    return sorted({reason for module in model.modules() if (reason := getattr(module, "vmap_blocker", None))})


class StackedModels:
    """Members' parameters and buffers stacked along dim 0; the members are views into them.

    `params` are the optimizer's leaves (requires_grad); `forward(images, masks)` runs every member
    on its own batch: images (k, b, ...), path masks (k, 2 depth, b, 1, 1) -> logits (k, b, classes).
    """

    def __init__(self, members: list[nn.Module]) -> None:
        if not members:
            raise ValueError("StackedModels needs at least one member")
        self.members = members
        self.template = members[0]  # functional_call swaps the stacked tensors into it per call
        named = [dict(m.named_parameters()) for m in members]
        self.params: dict[str, Tensor] = {
            name: torch.stack([n[name].detach() for n in named]).requires_grad_(p.requires_grad)
            for name, p in named[0].items()}
        buffers = [dict(m.named_buffers()) for m in members]
        self.buffers: dict[str, Tensor] = {name: torch.stack([b[name] for b in buffers]) for name in buffers[0]}
        for i, member in enumerate(members):
            for name, stacked in self.params.items():
                _owner(member, name)._parameters[name.rsplit(".", 1)[-1]].data = stacked.data[i]
            for name, stacked in self.buffers.items():
                _owner(member, name)._buffers[name.rsplit(".", 1)[-1]] = stacked[i]

    def __len__(self) -> int:
        return len(self.members)

    def train(self, mode: bool = True) -> None:
        for member in self.members:
            member.train(mode)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return list(self.params.items())

    def member_forward(self) -> Callable[..., Tensor]:
        """(params, buffers, images, masks) of ONE member -> its logits: the function vmap maps."""
        template = self.template

        def forward(params: dict[str, Tensor], buffers: dict[str, Tensor], images: Tensor, masks: Tensor) -> Tensor:
            return functional_call(template, (params, buffers), (images, masks))

        return forward

    def vmapped(self, member_fn: Callable[..., "tuple[Tensor, Tensor]"]) -> Callable[..., "tuple[Tensor, Tensor]"]:
        """member_fn(params, buffers, *batched inputs) mapped over the members (randomness is an
        error: everything random is drawn outside, per member). Exact attention runs SDPA's math
        kernel inside: the fused kernels (flash, memory-efficient) have no vmap batching rule, so vmap
        would run them member by member ("performance drop" warnings), while the math kernel is
        matmuls and a softmax, batched over the members like every other op."""
        mapped = vmap(member_fn, randomness="error")

        def run(*args: Tensor) -> "tuple[Tensor, Tensor]":
            with sdpa_kernel(SDPBackend.MATH):
                return mapped(*args)

        return run

    def member_optimizer_state(self, state: dict, i: int) -> dict:
        """Member i's slice of the stacked optimizer's state_dict, in the layout a solo run's optimizer
        has (same parameter order and groups): a fused member's checkpoint is a solo checkpoint."""
        per_param = {}
        for index, values in state["state"].items():
            per_param[index] = {k: (v[i].clone() if torch.is_tensor(v) and v.ndim > 0 else
                                    (v.clone() if torch.is_tensor(v) else v)) for k, v in values.items()}
        return {"state": per_param, "param_groups": [dict(g) for g in state["param_groups"]]}

    @staticmethod
    def stack_optimizer_states(states: list[dict]) -> dict:
        """The stacked optimizer's state_dict from the members' (solo-layout) ones: the inverse of
        member_optimizer_state. Scalar entries (AdamW's step) must agree across members."""
        first = states[0]
        stacked = {}
        for index, values in first["state"].items():
            entry = {}
            for key, value in values.items():
                column = [s["state"][index][key] for s in states]
                if torch.is_tensor(value) and value.ndim > 0:
                    entry[key] = torch.stack(column)
                else:
                    if any(not _same(c, value) for c in column):
                        raise ValueError(f"optimizer state {key!r} of parameter {index} differs between members "
                                         f"({column}); allowed: members at the same step")
                    entry[key] = value.clone() if torch.is_tensor(value) else value
            stacked[index] = entry
        return {"state": stacked, "param_groups": [dict(g) for g in first["param_groups"]]}


def _owner(model: nn.Module, dotted: str) -> nn.Module:
    """The submodule that holds the parameter or buffer `dotted` ('blocks.0.attn.qkv.weight')."""
    return model.get_submodule(dotted.rsplit(".", 1)[0]) if "." in dotted else model


def _same(a: object, b: object) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return bool(torch.equal(a, b))
    return a == b
