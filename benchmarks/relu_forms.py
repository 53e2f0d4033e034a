"""Performer-ReLU's two ReLU forms side by side: `torch.relu` against `relu_as_product` (x * 1[x > 0],
rpevit/attention/kernelized.py), which gives the same values and gradients (tests/test_attention_kernelized.py).

    OMP_NUM_THREADS=1 python benchmarks/relu_forms.py --threads 1 --json results/compile_cpu_1thread/relu_forms.json

Why the product: torch.relu's backward (`threshold_backward`) is slow on the CPU when the incoming gradient is
transposed relative to the features, which is how linear attention's phi(K)^T [V, 1] hands it back. Printed:
that op alone on contiguous and on transposed gradients, then the whole training step of relu + ape at the CPU
protocol's model (benchmarks/throughput.py's `measure`, solo eager), the two forms interleaved over `--rounds`
rounds so that a drifting machine moves both alike; the ratio is product / torch.relu images/s.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import throughput  # noqa: E402
from rpevit.analysis.common import write_text_file  # noqa: E402
from rpevit import registry  # noqa: E402
from rpevit.attention import kernelized  # noqa: E402
from rpevit.metrics import device_name  # noqa: E402

FORMS = {"torch.relu": torch.relu, "relu_as_product": kernelized.relu_as_product}


def op_ms(grad: torch.Tensor, out: torch.Tensor, repeats: int = 20) -> float:
    """Median milliseconds of threshold_backward(grad, out, 0)."""
    times = []
    for _ in range(repeats + 3):
        t0 = time.perf_counter()
        torch.ops.aten.threshold_backward(grad, out, 0.0)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cpu", choices=sorted(throughput.MODELS),
                        help="throughput.py's model (tiny: a quick check of this script, not a figure)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    registry.load_all()
    model = throughput.MODELS[args.model]
    tokens = (32 // model["patch_size"]) ** 2 + 1  # CIFAR-10's 32 x 32 images, and the class token
    shape = (model["batch_size"], model["heads"], tokens, model["num_features"])
    out = torch.rand(shape) - 0.5
    transposed = torch.randn(shape[:2] + shape[:1:-1]).transpose(-1, -2)
    op = {"contiguous_ms": op_ms(torch.randn(shape), out), "transposed_ms": op_ms(transposed, out)}
    print(f"{device_name(torch.device('cpu'))}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"threshold_backward on {tuple(shape)}: {op['contiguous_ms']:.2f} ms with a contiguous gradient, "
          f"{op['transposed_ms']:.2f} ms with a transposed one", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in FORMS}
    try:
        for _ in range(args.rounds):
            for name, form in FORMS.items():
                kernelized.relu_as_product = form
                row = throughput.measure(model, 1, "off", torch.device("cpu"), args.steps, 3, 3, "relu", "ape")
                rates[name].append(row["images_per_s"])
                print(f"  relu+ape training step, {name:<16} {row['images_per_s']:7.0f} images/s", flush=True)
    finally:
        kernelized.relu_as_product = FORMS["relu_as_product"]
    ratios = [p / r for p, r in zip(rates["relu_as_product"], rates["torch.relu"])]
    print(f"relu_as_product / torch.relu, per round: {', '.join(f'{r:.3f}x' for r in ratios)}")
    if args.json:  # atomic and never through a link (write_text_file: one line where a link is there)
        write_text_file(Path(args.json), json.dumps({
            "device": device_name(torch.device("cpu")), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "model": model, "threshold_backward": op, "images_per_s": rates,
            "ratio_per_round": ratios, "command": "python benchmarks/relu_forms.py " + " ".join(sys.argv[1:])}, indent=1))


if __name__ == "__main__":
    main()
