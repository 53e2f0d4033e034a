"""Each member's random streams, so a member of a fused group draws what its solo run draws.

A run draws from two streams while it trains: its data order and augmentation (its own generator,
seeded with its seed) and its stochastic-depth masks. A solo run (a group of one) draws its masks
from the process's global generator, as the eager forward's dropout does, and its checkpoint holds
the global states. A member of a larger group cannot share the global generator with the others:
it gets a generator of its own that starts where a solo run's global one stands when training
starts (the CPU generator after its model is built; on a GPU, the CUDA generator `manual_seed(seed)`
left), and its checkpoint holds that generator's state in the solo layout, so either can continue
the other's checkpoint (tests/test_fused_group.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class MemberRandom:
    """`data`: order and augmentation; `masks`: stochastic depth (the global generator when alone)."""

    data: torch.Generator
    masks: torch.Generator
    cpu_state: Tensor  # the global CPU generator's state where this member's training starts
    alone: bool
    device: torch.device

    def state(self) -> dict:
        """The states a checkpoint holds: `torch`, `data`, and `cuda` on a GPU."""
        cuda = self.device.type == "cuda"
        if self.alone:
            return {"torch": torch.get_rng_state(), "data": self.data.get_state(),
                    **({"cuda": torch.cuda.get_rng_state(self.device)} if cuda else {})}
        if not cuda:
            return {"torch": self.masks.get_state(), "data": self.data.get_state()}
        return {"torch": self.cpu_state, "data": self.data.get_state(), "cuda": self.masks.get_state()}

    def load(self, state: dict) -> None:
        """Continue from a checkpoint's states, written on this device kind (a CPU checkpoint on a GPU, or the
        other way round, is refused before: rpevit.checkpoint.check_device; their data generators differ)."""
        self.data.set_state(state["data"])
        if self.alone:
            torch.set_rng_state(state["torch"])
        if self.device.type == "cpu":
            self.masks.set_state(state["torch"])
        elif "cuda" in state:
            self.masks.set_state(state["cuda"])


def member_random(seed: int, device: torch.device, alone: bool) -> MemberRandom:
    """A member's streams, made right after its model is built (build_model seeds the global one)."""
    cpu_state = torch.get_rng_state()
    data = torch.Generator(device=device).manual_seed(seed)
    if alone:
        return MemberRandom(data, _global_generator(device), cpu_state, True, device)
    masks = torch.Generator(device=device)
    if device.type == "cpu":
        masks.set_state(cpu_state)
    else:
        masks.manual_seed(seed)
    return MemberRandom(data, masks, cpu_state, False, device)


def _global_generator(device: torch.device) -> torch.Generator:
    if device.type == "cpu":
        return torch.default_generator
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


__all__ = ["MemberRandom", "member_random"]
