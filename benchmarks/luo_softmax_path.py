"""softmax + luo_rpe in a fused group: the explicit biased softmax (what runs under vmap since issue 40)
against SDPA with the per-member float mask (what ran before; broken on CUDA by pytorch/pytorch#161310),
side by side on this device, eager (the ratio is about the kernels, not the compiler).

    python benchmarks/luo_softmax_path.py [--members 3] [--samples 5] [--steps 3] [--batch 32]

Both paths compute the same function (tests/test_pe_relative_bias.py, float64); this times a fused
group's whole training step with each, for all12.yaml's two models (MNIST: 49 tokens, dim 64, depth 4;
CIFAR-10: 64 tokens, dim 192, depth 9), the two paths alternating sample by sample so that drift of
a shared machine hits both alike; prints the medians and their ratio.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rpevit import registry  # noqa: E402
from rpevit.metrics import device_name  # noqa: E402
from rpevit.pe import relative_bias  # noqa: E402
from throughput import MODELS, measure  # noqa: E402

ALL12_MODELS = {"mnist (49 tokens)": {"dataset": "mnist", "patch_size": 4, "dim": 64, "depth": 4, "heads": 4,
                                      "mlp_ratio": 2.0, "num_features": 64},
                "cifar10 (64 tokens)": {k: v for k, v in MODELS["gpu"].items() if k != "batch_size"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    registry.load_all()
    device = torch.device(args.device)
    explicit_check = relative_bias.under_vmap
    print(f"device: {device_name(device)}; torch {torch.__version__}; fused k={args.members}, batch {args.batch}, "
          f"eager; {args.samples} alternating samples of {args.steps} steps per path")
    for name, model in ALL12_MODELS.items():
        model = {**model, "batch_size": args.batch}
        rates: dict[str, list[float]] = {"explicit": [], "sdpa mask": []}
        for _ in range(args.samples):
            for path in rates:
                relative_bias.under_vmap = explicit_check if path == "explicit" else (lambda x: False)
                try:
                    row = measure(model, args.members, "off", device, args.steps, 1, 3, "softmax", "luo_rpe")
                finally:
                    relative_bias.under_vmap = explicit_check
                rates[path].append(row["images_per_s"])
        median = {path: sorted(r)[len(r) // 2] for path, r in rates.items()}
        print(f"  {name:<20} explicit {median['explicit']:8.1f} images/s, SDPA with mask {median['sdpa mask']:8.1f} "
              f"images/s: explicit / SDPA = {median['explicit'] / median['sdpa mask']:.3f} "
              f"(samples {[round(x, 1) for x in rates['explicit']]} vs {[round(x, 1) for x in rates['sdpa mask']]})")


if __name__ == "__main__":
    main()
