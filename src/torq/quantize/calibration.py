"""Calibration data for static quantization: ORT readers, on-disk datasets, synthetic data.

Three sources, in order of preference:
  * an ``onnxruntime.quantization.CalibrationDataReader`` from the caller (used as is);
  * a dataset on disk (``.npz`` keyed by input name, or a folder of ``<input>.npy`` files);
  * a deterministic synthetic reader (uniform [-1, 1), ``default_rng(0)``) so that the same
    model always gets the same scales, run after run.

Dataset layout: per input an array whose FIRST axis is the sample axis, i.e. shape
``(N, *input_shape)``; when the input's first dim is a batch dim of 1 (or dynamic) the
batch axis may be left out, ``(N, *input_shape[1:])``, and each sample is fed as a batch of 1.
Dynamic dims match any size. In a folder, ``<input>.npy`` uses the input name with ``/``, ``\\``
and ``:`` replaced by ``_`` (ONNX names such as ``input:0`` are not valid file names everywhere).
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader

from ..errors import TorqError, one_line, quote
from ..graph.inputs import input_specs


def probe_session(model: onnx.ModelProto, outputs=()):
    """An ORT session running ``model`` as written (no graph optimisations, so tensors keep their
    names and float ops stay float) with the float tensors ``outputs`` exposed as extra graph
    outputs: how calibration-time transforms and SQNR read intermediate activations."""
    import onnxruntime as ort
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                          for t in outputs if t not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


class SyntheticDataReader(CalibrationDataReader):
    """Uniform [-1, 1) samples from ``default_rng(seed)``; dynamic dims -> 1.

    Deterministic on purpose: quantizing the same model twice gives the same scales, and
    ``reset()`` re-seeds so a second pass (entropy/percentile histograms) sees identical data.
    Integer/bool inputs get zeros (safe as indices)."""

    def __init__(self, model: onnx.ModelProto, num_samples: int = 20, seed: int = 0):
        self.specs = [(n, [d or 1 for d in dims], dt) for n, dims, dt in input_specs(model)]
        self.num_samples = num_samples
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        self._i = 0

    def rewind(self) -> None:  # ORT's name for the same idea
        self.reset()

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._i >= self.num_samples:
            return None
        self._i += 1
        arrays = _synthetic_sample([(shape, dt) for _, shape, dt in self.specs], self.seed, self._i - 1)
        return {name: a for (name, _, _), a in zip(self.specs, arrays)}


#: (shapes and dtypes, seed) -> (generator, samples drawn so far): every layer of a model with the
#: same input shapes gets the same synthetic samples, so discover draws them once (read-only
#: arrays; the oldest entries go beyond _DRAWN_MAX_BYTES).
_DRAWN: dict = {}
_DRAWN_MAX_BYTES = 256 << 20


def _synthetic_sample(specs: list, seed: int, i: int) -> list[np.ndarray]:
    """Sample `i` of the deterministic sequence for these input shapes: the i-th draw of
    ``default_rng(seed)`` (uniform [-1, 1) floats, zeros for integer/bool inputs)."""
    key = (tuple((tuple(shape), dt.str) for shape, dt in specs), seed)
    rng, drawn = _DRAWN.pop(key, None) or (np.random.default_rng(seed), [])
    _DRAWN[key] = (rng, drawn)          # most recently used last
    while len(drawn) <= i:
        sample = []
        for shape, dt in specs:
            a = (rng.random(shape).astype(dt) * 2.0 - 1.0).astype(dt) if dt.kind == "f" \
                else np.zeros(shape, dtype=dt)
            a.flags.writeable = False
            sample.append(a)
        drawn.append(sample)
    while len(_DRAWN) > 1 and sum(a.nbytes for _, d in _DRAWN.values() for s in d for a in s) > _DRAWN_MAX_BYTES:
        del _DRAWN[next(iter(_DRAWN))]
    return drawn[i]


class ArrayDataReader(CalibrationDataReader):
    """Feeds pre-loaded per-input sample lists (what a dataset on disk turns into)."""

    def __init__(self, samples: list[dict[str, np.ndarray]]):
        self.samples = samples
        self._i = 0

    def reset(self) -> None:
        self._i = 0

    def rewind(self) -> None:
        self.reset()

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._i >= len(self.samples):
            return None
        self._i += 1
        return self.samples[self._i - 1]


def npy_file_name(input_name: str) -> str:
    """File name of an input inside a ``.npy`` dataset folder."""
    return "".join("_" if c in "/\\:" else c for c in input_name) + ".npy"


def load_dataset(path: str | os.PathLike, model: onnx.ModelProto,
                 num_samples: int | None = None) -> ArrayDataReader:
    """Read an ``.npz`` file or a folder of ``.npy`` files into a reader (first ``num_samples``)."""
    path = Path(path)
    if not path.exists():
        raise TorqError(f"{path}: calibration data not found (--calibration-data)")
    specs = input_specs(model)
    if path.is_dir():
        arrays = _load_npy_folder(path, specs)
    else:
        arrays = _load_npz(path, specs)
    counts = {name: len(a) for name, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise TorqError(f"{path}: inputs have different sample counts {counts}; "
                        "the first axis must be the sample axis for every input")
    n = next(iter(counts.values()))
    if n == 0:
        raise TorqError(f"{path}: calibration data has 0 samples")
    if num_samples is not None:
        n = min(n, num_samples)
    per_input = {name: _samples_for(path, name, dims, dt, arrays[name])
                 for name, dims, dt in specs}
    return ArrayDataReader([{name: per_input[name][i] for name in per_input} for i in range(n)])


def _load_npz(path: Path, specs) -> dict[str, np.ndarray]:
    def unreadable(e: Exception) -> TorqError:
        return TorqError(f"{path}: cannot read calibration data as .npz: "
                         f"{one_line(e, 200)}")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise unreadable(e) from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise TorqError(f"{path}: calibration data must be an .npz archive keyed by input name "
                        "or a folder of <input>.npy files")
    with z:
        keys = set(z.files)
        missing = [name for name, _, _ in specs if name not in keys]
        if missing:
            raise TorqError(f"{path}: calibration data has no array for model input(s) "
                            f"{', '.join(repr(m) for m in missing)} (keys: "
                            f"{', '.join(sorted(keys)) or 'none'})")
        try:
            return {name: z[name] for name, _, _ in specs}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise unreadable(e) from None


def _load_npy_folder(path: Path, specs) -> dict[str, np.ndarray]:
    arrays = {}
    missing = [npy_file_name(name) for name, _, _ in specs if not (path / npy_file_name(name)).is_file()]
    if missing:
        raise TorqError(f"{path}: calibration folder lacks {', '.join(missing)} "
                        "(one <input>.npy per model input)")
    for name, _, _ in specs:
        f = path / npy_file_name(name)
        try:
            arrays[name] = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise TorqError(f"{f}: cannot read calibration array: {one_line(e, 200)}") from None
        if not isinstance(arrays[name], np.ndarray):
            raise TorqError(f"{f}: expected a single .npy array")
    return arrays


def _matches(shape: tuple[int, ...], dims: list[int | None]) -> bool:
    return len(shape) == len(dims) and all(d is None or d == s for s, d in zip(shape, dims))


def _samples_for(path: Path, name: str, dims, dt: np.dtype, arr: np.ndarray) -> list[np.ndarray]:
    """Split one input's array into per-sample arrays of the input's rank and dtype."""
    if arr.dtype.kind not in "biuf":
        raise TorqError(f"{path}: array for input {quote(name)} has dtype {arr.dtype}, expected numbers")
    shape = tuple(arr.shape)
    if arr.ndim >= 1 and _matches(shape[1:], dims):
        samples = [arr[i] for i in range(shape[0])]
    elif dims and dims[0] in (None, 1) and arr.ndim >= 1 and _matches(shape[1:], dims[1:]):
        samples = [arr[i:i + 1] for i in range(shape[0])]
    else:
        want = "(N, " + ", ".join("?" if d is None else str(d) for d in dims) + ")"
        raise TorqError(f"{path}: array for input {quote(name)} has shape {shape}, expected {want} "
                        "(first axis = samples)")
    return [np.ascontiguousarray(s, dtype=dt) for s in samples]


def make_reader(model: onnx.ModelProto, *, calibration_data_reader=None, calibration_data=None,
                num_calib: int = 20) -> CalibrationDataReader:
    """Pick the calibration source: caller's reader, then dataset on disk, then synthetic."""
    if calibration_data_reader is not None and calibration_data is not None:
        raise TorqError("give either calibration_data_reader or calibration_data "
                        "(--calibration-data), not both")
    if not isinstance(num_calib, int) or isinstance(num_calib, bool) or num_calib < 1:
        raise TorqError(f"--num-calib must be a positive integer, got {num_calib!r}")
    if calibration_data_reader is not None:
        if not callable(getattr(calibration_data_reader, "get_next", None)):
            raise TorqError("calibration_data_reader must be an onnxruntime.quantization."
                            "CalibrationDataReader (it has no get_next())")
        return calibration_data_reader
    if calibration_data is not None:
        return load_dataset(calibration_data, model, num_calib)
    return SyntheticDataReader(model, num_calib)
