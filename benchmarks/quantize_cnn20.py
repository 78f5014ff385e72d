"""Time torq.quantize on the built-in 20-conv CNN, side by side with a bare ORT quantize_static.

    .venv/bin/python benchmarks/quantize_cnn20.py [--repeat 3]

Both use QDQ, per-tensor, A8W8, MinMax, the same 20 synthetic samples; the ratio is torq's
overhead (loading/validation, pre-processing, stale value_info clean-up) over ORT's own work."""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

from torq.examples import build_cnn20
from torq.quantize import SyntheticDataReader, quantize


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cnn20.onnx"
        model = build_cnn20(path)
        t_torq = _best(lambda: quantize(path, Path(tmp) / "torq.onnx", num_calib=20), args.repeat)

        def bare():
            quantize_static(str(path), str(Path(tmp) / "ort.onnx"), SyntheticDataReader(model, 20),
                            quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8,
                            extra_options={"ForceQuantizeNoInputCheck": True})
        t_ort = _best(bare, args.repeat)
    print(f"cnn20 (20 Conv, 3x64x64) QDQ per-tensor, 20 calibration samples, best of {args.repeat}:")
    print(f"  torq.quantize          {t_torq:6.2f} s")
    print(f"  ORT quantize_static    {t_ort:6.2f} s")
    print(f"  ratio torq/ORT         {t_torq / t_ort:6.2f}")


if __name__ == "__main__":
    main()
