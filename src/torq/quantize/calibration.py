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
from ..graph.input_shape import static_dims


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
    so.log_severity_level = 4          # a failing kernel is our one-line error, not its log
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


class SyntheticDataReader(CalibrationDataReader):
    """Uniform [-1, 1) samples from ``default_rng(seed)``; an open batch dim -> 1 (another open
    dim is an error: ``torq.graph.input_shape``).

    Deterministic on purpose: quantizing the same model twice gives the same scales, and
    ``reset()`` re-seeds so a second pass (entropy/percentile histograms) sees identical data.
    Integer/bool inputs get zeros (safe as indices)."""

    def __init__(self, model: onnx.ModelProto, num_samples: int = 20, seed: int = 0):
        self.specs = [(n, static_dims(n, dims, "synthetic calibration"), dt) for n, dims, dt in input_specs(model)]
        self.num_samples = num_samples
        self.seed = seed
        self.reset()

    def __len__(self) -> int:
        return self.num_samples

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

    def __len__(self) -> int:
        return len(self.samples)

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


def load_calibration_arrays(path: str | os.PathLike, model: onnx.ModelProto,
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


def rewind(reader) -> None:
    """Start a reader over (``rewind`` is ORT's name, ``reset`` ours); a no-op if it cannot."""
    for name in ("rewind", "reset"):
        if callable(getattr(reader, name, None)):
            getattr(reader, name)()
            return


def make_reader(model: onnx.ModelProto, recipe) -> CalibrationDataReader:
    """The recipe's calibration source for ``model``: data on disk, else synthetic samples.

    On disk: an ``.npz`` keyed by input name or a folder of ``<input>.npy`` (arrays, fed as
    they are), or images — a plain image folder, a ``labels.tsv`` folder, an IDX file or an
    ``.npz`` with ``x`` — turned into inputs by ``recipe.preprocess`` (as ``evaluate`` does)."""
    if recipe.calibration_data is None:
        return SyntheticDataReader(model, recipe.num_calib)
    if is_image_data(recipe.calibration_data, model):
        return image_reader(model, recipe.calibration_data, recipe.preprocess, recipe.num_calib)
    return load_calibration_arrays(recipe.calibration_data, model, recipe.num_calib)


def is_image_data(spec, model: onnx.ModelProto) -> bool:
    """True unless ``spec`` is an array dataset for ``model`` (``.npz`` with its input names, or a
    folder of ``<input>.npy``)."""
    path = Path(str(spec))
    if path.is_dir():
        return not any(path.glob("*.npy"))
    if path.suffix == ".npz" and path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                keys = set(z.files)
        except Exception:  # noqa: BLE001 - unreadable: the array loader names the problem
            return False
        return not {name for name, _, _ in input_specs(model)} & keys and "x" in keys
    return "idx" in path.name or ("," in str(spec) and not path.exists())


class ImageReader(CalibrationDataReader):
    """Feeds preprocessed images one by one to ORT's calibrator; ``rewind`` starts over."""

    def __init__(self, data, prep, shape, input_name: str, count: int):
        self.data, self.prep, self.shape, self.name = data, prep, shape, input_name
        self.count = min(count, len(data))
        self.i = 0

    def __len__(self) -> int:
        return self.count

    def get_next(self):
        if self.i >= self.count:
            return None
        self.i += 1
        return {self.name: self.prep.batch([self.data.load(self.i - 1)], self.shape, self.name)}

    def rewind(self):
        self.i = 0


def image_input(model: onnx.ModelProto, what: str = "calibrating on images") -> tuple[str, tuple]:
    """(input name, per-image shape) of the model's single image input; static C, H, W required."""
    specs = input_specs(model)
    if len(specs) != 1:
        raise TorqError(f"{what} needs a model with one image input, this one has {len(specs)}")
    name, dims, _ = specs[0]
    static_dims(name, dims, what)
    if len(dims) != 4:
        raise TorqError(f"model input {name!r} must be N×C×H×W or N×H×W×C with static C, H, W; "
                        f"it is {[d or '?' for d in dims]}")
    return name, tuple(dims[1:])


def has_norm(preprocess: str) -> bool:
    """Whether a --preprocess spec says how pixels are normalised (norm= or mean=/std=)."""
    keys = {p.partition("=")[0].strip().lower() for p in (preprocess or "").split(",")}
    return bool(keys & {"norm", "mean", "std"})


def image_reader(model: onnx.ModelProto, spec, preprocess: str, count: int) -> ImageReader:
    """Calibration images (``torq.data`` SPEC) through the declared preprocessing."""
    from ..data import load_dataset as load_images
    from ..data import parse_preprocess
    if not has_norm(preprocess):
        raise TorqError(f"--calibration-data {spec}: images need --preprocess with norm= (tf, imagenet, "
                        "mnist, unit, raw) or mean=/std=, e.g. resize=256,crop=224,norm=tf: "
                        "raw 0..255 pixels are rarely what a model was trained on")
    name, shape = image_input(model)
    return ImageReader(load_images(spec, labelled=False), parse_preprocess(preprocess), shape, name, count)
