"""Labelled evaluation data from disk, named by a SPEC string.

A SPEC is one of:
  * a folder holding ``labels.tsv`` (tab-separated, header ``file  class_index ...``; the
    format of ImageNet-sample folders) and the image files it names;
  * an ``.npz`` with ``x`` (N images: N×H×W gray, N×H×W×3 RGB, or already N×C×H×W float) and
    ``y`` (N integer labels);
  * an IDX image file (MNIST / Fashion-MNIST ``*-images-idx3-ubyte[.gz]``): its label file is
    found by name (``images-idx3`` -> ``labels-idx1``), or given explicitly as ``IMAGES,LABELS``.

A Dataset only reads; images come back raw (uint8 H×W or H×W×3 RGB, in file order) and are
turned into model inputs by a declared ``Preprocess``. Every problem with the files is a
one-line TorqError naming the file (and the line or index at fault).
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TorqError, one_line

LABELS_FILE = "labels.tsv"


@dataclass
class Dataset:
    """N labelled images. ``load(i)`` returns image i raw; ``labels`` are int64 class indices."""
    name: str
    labels: np.ndarray
    _loader: object = field(repr=False)
    files: list[str] | None = None        # per-image source names, for error messages/reports

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, i: int) -> np.ndarray:
        return self._loader(int(i))

    def subset(self, indices) -> "Dataset":
        idx = np.asarray(indices, dtype=np.int64)
        files = [self.files[i] for i in idx] if self.files else None
        return Dataset(self.name, self.labels[idx], lambda i: self._loader(int(idx[i])), files)

    def sources(self) -> set:
        """The real files the images come from (links and other spellings of a path resolved):
        each image file of a folder, else the dataset file itself."""
        if self.files:
            return {(Path(self.name) / f).resolve() for f in self.files}
        return {Path(self.name).resolve()}

    def check_classes(self, num_classes: int) -> None:
        """Every label must index a model output; else name the first bad one."""
        bad = np.flatnonzero((self.labels < 0) | (self.labels >= num_classes))
        if bad.size:
            i = int(bad[0])
            where = self.files[i] if self.files else f"sample {i}"
            raise TorqError(f"{self.name}: class index {int(self.labels[i])} of {where} is out of "
                            f"range: the model has {num_classes} classes (0..{num_classes - 1})")


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def load_dataset(spec: str | os.PathLike, labelled: bool = True) -> Dataset:
    """Open a dataset SPEC (see module doc); the files are checked, images read lazily.

    ``labelled=False`` (calibration data) also accepts a plain folder of images (labels -1)."""
    text = str(spec)
    if "," in text and not Path(text).exists():
        images, labels = text.split(",", 1)
        return _idx_dataset(Path(images), Path(labels))
    path = Path(text)
    if not path.exists():
        raise TorqError(f"dataset {text}: no such file or folder")
    if path.is_dir():
        if not labelled and not (path / LABELS_FILE).exists():
            return _unlabelled_folder(path)
        return _folder_dataset(path)
    if path.suffix == ".npz":
        return _npz_dataset(path)
    if "idx" in path.name:
        return _idx_dataset(path, _idx_label_path(path))
    raise TorqError(f"dataset {text}: unknown format: expected a folder with {LABELS_FILE}, an "
                    ".npz with x and y, or an IDX images file (*-images-idx3-ubyte[.gz])")


# ----------------------------------------------------------------------------- image folder

def _folder_dataset(folder: Path) -> Dataset:
    files, labels = parse_labels_file(folder / LABELS_FILE)
    root = folder.resolve()
    for f in files:
        where = (folder / f).resolve()
        if where != root and root not in where.parents:
            raise TorqError(f"{folder / LABELS_FILE}: image {f!r} is outside the dataset folder {folder} "
                            "(entries are file names relative to it)")
        if not (folder / f).is_file():
            raise TorqError(f"{folder / LABELS_FILE}: image {f} is listed but missing in {folder}")
    return Dataset(str(folder), np.asarray(labels, dtype=np.int64),
                   lambda i: read_image(folder / files[i]), files)


def _unlabelled_folder(folder: Path) -> Dataset:
    files = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise TorqError(f"dataset {folder}: no {LABELS_FILE} and no image files")
    return Dataset(str(folder), np.full(len(files), -1, np.int64), lambda i: read_image(folder / files[i]), files)


def parse_labels_file(path: Path) -> tuple[list[str], list[int]]:
    """``labels.tsv``: a header naming ``file`` and ``class_index`` columns, one image a line."""
    if not path.is_file():
        raise TorqError(f"dataset {path.parent}: no {LABELS_FILE} (tab-separated: file, class_index, ...)")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    header = lines[0].split("\t") if lines else []
    if "file" not in header or "class_index" not in header:
        raise TorqError(f"{path}:1: header must name the columns 'file' and 'class_index' (tab-separated)")
    fcol, ccol = header.index("file"), header.index("class_index")
    files, labels = [], []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) <= max(fcol, ccol) or not cols[fcol]:
            raise TorqError(f"{path}:{n}: expected {len(header)} tab-separated columns, got {len(cols)}")
        try:
            label = int(cols[ccol])
        except ValueError:
            raise TorqError(f"{path}:{n}: class_index {cols[ccol]!r} is not an integer") from None
        if not -1 <= label < 2**31:
            raise TorqError(f"{path}:{n}: class_index {label} is out of range")
        labels.append(label)
        files.append(cols[fcol])
    if not files:
        raise TorqError(f"{path}: lists no images")
    return files, labels


MAX_IMAGE_PIXELS = 64 << 20      # a decoded image holds 3 bytes a pixel


def read_image(path: Path) -> np.ndarray:
    """An image file as uint8 RGB H×W×3, read faithfully or refused with the reason.

    EXIF orientation applied; gray, palette, CMYK and alpha images converted to RGB; 16-bit
    images scaled to 8 bits (>> 8), float images read as 0..1 (or 0..255) intensities."""
    import warnings

    from PIL import Image, ImageOps, UnidentifiedImageError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise TorqError(f"{path}: image is {w}×{h} ({w * h / 1e6:.0f} MP), larger than the "
                                    f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP evaluate reads")
                return _as_rgb(ImageOps.exif_transpose(im), path)
    except TorqError:
        raise
    except Image.DecompressionBombError as e:
        raise TorqError(f"{path}: image is larger than the {MAX_IMAGE_PIXELS / 1e6:.0f} MP evaluate reads "
                        f"({one_line(e, 80)})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise TorqError(f"{path}: unreadable image: {one_line(e, 120)}") from None


def _as_rgb(im, path: Path) -> np.ndarray:
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        a = np.asarray(im)
        if im.mode == "F":
            a = a.astype(np.float64)
            if not np.isfinite(a).all() or a.min() < 0 or a.max() > 255:
                raise TorqError(f"{path}: float image with values outside 0..1 and 0..255 "
                                f"({np.nanmin(a):g}..{np.nanmax(a):g}); convert it to 8 bits")
            a = np.rint(a * 255 if a.max() <= 1 else a)
        elif a.min() < 0 or a.max() > 65535:
            raise TorqError(f"{path}: {im.mode} image with values outside 0..65535; convert it to 8 bits")
        elif im.mode != "I" or a.max() > 255:
            a = a.astype(np.uint32) >> 8        # 16-bit intensities to 8 bits
        gray = a.astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if im.mode not in ("RGB", "L", "1", "P", "PA", "RGBA", "LA", "CMYK", "YCbCr", "RGBX", "La"):
        raise TorqError(f"{path}: images of mode {im.mode} are not supported; convert it to RGB")
    return np.asarray(im.convert("RGBA").convert("RGB") if im.mode in ("P", "PA") else im.convert("RGB"))


# ----------------------------------------------------------------------------- npz

def _npz_dataset(path: Path) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in ("x", "y") if k not in z.files]
            if missing:
                raise TorqError(f"{path}: missing array(s) {', '.join(missing)} (an .npz dataset "
                                f"holds x = images and y = labels; it has {', '.join(z.files) or 'none'})")
            x, y = z["x"], z["y"]
    except TorqError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile/pickle/format errors, all "not a valid npz"
        raise TorqError(f"{path}: not a readable .npz: {one_line(e, 120)}") from None
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise TorqError(f"{path}: y must be a 1-D integer array of labels, got {y.dtype} {y.shape}")
    if len(x) != len(y):
        raise TorqError(f"{path}: x has {len(x)} images but y has {len(y)} labels")
    if len(x) == 0:
        raise TorqError(f"{path}: holds no images (x has shape {list(x.shape)})")
    return Dataset(str(path), y.astype(np.int64), lambda i: x[i])


# ----------------------------------------------------------------------------- IDX (MNIST)

def _idx_label_path(images: Path) -> Path:
    if "images-idx3" not in images.name:
        raise TorqError(f"dataset {images}: cannot find its labels file by name (expected "
                        "'*-images-idx3-ubyte[.gz]'); pass IMAGES,LABELS")
    return images.with_name(images.name.replace("images-idx3", "labels-idx1"))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip or not): magic 0x00 0x00 <dtype 0x08=uint8> <ndim>, big-endian dims."""
    if not path.is_file():
        raise TorqError(f"{path}: no such IDX file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise TorqError(f"{path}: corrupt gzip: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise TorqError(f"{path}: not an unsigned-byte IDX file (bad magic {raw[:4].hex()})")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise TorqError(f"{path}: truncated IDX header")
    dims = [int.from_bytes(raw[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim)]
    size = int(np.prod(dims)) if dims else 0
    body = raw[4 + 4 * ndim:]
    if len(body) != size:
        raise TorqError(f"{path}: IDX header says {dims} ({size} bytes) but holds {len(body)} bytes")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def _idx_dataset(images: Path, labels: Path) -> Dataset:
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1:
        raise TorqError(f"{images}: expected N×H×W images and N labels, got {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise TorqError(f"{images}: {len(x)} images but {labels} has {len(y)} labels")
    return Dataset(str(images), y.astype(np.int64), lambda i: x[i])
