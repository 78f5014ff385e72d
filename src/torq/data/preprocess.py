"""Declared preprocessing: how a raw image (uint8 gray or RGB) becomes one model input.

Declared, not hard-coded per model, as one string of ``key=value`` pairs, e.g.
``resize=256,crop=224,norm=tf`` (EfficientNet-Lite) or ``norm=mnist,channels=1``:

  resize=S        short side to S pixels (bilinear), keeping the aspect ratio
  crop=C          centre crop C×C after resizing
  norm=NAME       tf: (x−127)/128 · imagenet: ImageNet mean/std · mnist: (x/255−0.1307)/0.3081
                  · unit: x/255 · raw: x (pixel values 0..255)
  mean=M std=S    explicit normalisation (x−M)/S on 0..255 pixels; one value or R/G/B
  order=rgb|bgr   channel order of the input tensor
  layout=nchw|nhwc
  channels=1|3    gray -> 3 channels by repetition, RGB -> 1 channel by luminance
                  (default: what the model input has)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TorqError

NORMS = {
    "tf": ((127.0,), (128.0,)),
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    "mnist": ((0.1307 * 255,), (0.3081 * 255,)),
    "unit": ((0.0,), (255.0,)),
    "raw": ((0.0,), (1.0,)),
}
_KEYS = ("resize", "crop", "norm", "mean", "std", "order", "layout", "channels")


@dataclass(frozen=True)
class Preprocess:
    resize: int | None = None
    crop: int | None = None
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    order: str = "rgb"
    layout: str = "nchw"
    channels: int | None = None

    def describe(self) -> str:
        parts = [f"resize={self.resize}" if self.resize else "", f"crop={self.crop}" if self.crop else "",
                 f"mean={'/'.join(f'{m:g}' for m in self.mean)}", f"std={'/'.join(f'{s:g}' for s in self.std)}",
                 f"order={self.order}", f"layout={self.layout}",
                 f"channels={self.channels}" if self.channels else ""]
        return ",".join(p for p in parts if p)

    def image(self, raw: np.ndarray, channels: int) -> np.ndarray:
        """One raw image -> float32 H×W×C (before layout), resized, cropped and normalised."""
        img = _as_uint8(raw)
        img = _to_channels(img, self.channels or channels)
        if self.resize:
            img = _resize_short(img, self.resize)
        if self.crop:
            img = _centre_crop(img, self.crop)
        if self.order == "bgr":
            img = img[..., ::-1]
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return (img.astype(np.float32) - mean) / std

    def batch(self, raws, shape: tuple[int, int, int], input_name: str = "input") -> np.ndarray:
        """Raw images -> one float32 batch for an input of per-image ``shape`` (in ``layout``)."""
        c, h, w = shape if self.layout == "nchw" else (shape[2], shape[0], shape[1])
        out = np.empty((len(raws), h, w, c), np.float32)
        for k, raw in enumerate(raws):
            img = self.image(raw, c)
            if img.shape != (h, w, c):
                raise TorqError(f"preprocessed image is {img.shape[0]}×{img.shape[1]}×{img.shape[2]} but "
                                f"model input {input_name!r} expects {h}×{w}×{c} (H×W×C): declare "
                                f"resize=/crop=/channels= in --preprocess (now: {self.describe()})")
            out[k] = img
        return np.ascontiguousarray(out.transpose(0, 3, 1, 2)) if self.layout == "nchw" else out


def parse_preprocess(text: str | None) -> Preprocess:
    """``key=value,...`` (see module doc) -> Preprocess; unknown keys/values name themselves."""
    kw: dict = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or key not in _KEYS:
            raise TorqError(f"--preprocess: bad item {part!r}: expected key=value with key one of {', '.join(_KEYS)}")
        if key in ("resize", "crop", "channels"):
            kw[key] = _positive_int(key, value)
        elif key == "norm":
            if value.lower() not in NORMS:
                raise TorqError(f"--preprocess: unknown norm={value}: choose one of {', '.join(NORMS)}")
            kw["mean"], kw["std"] = NORMS[value.lower()]
        elif key in ("mean", "std"):
            kw[key] = _floats(key, value)
        elif key == "order":
            kw[key] = _choice(key, value, ("rgb", "bgr"))
        else:
            kw[key] = _choice(key, value, ("nchw", "nhwc"))
    if kw.get("channels") not in (None, 1, 3):
        raise TorqError(f"--preprocess: channels={kw['channels']}: only 1 or 3 are supported")
    if any(s == 0 for s in kw.get("std", (1.0,))):
        raise TorqError("--preprocess: std must not be 0")
    return Preprocess(**kw)


def _positive_int(key, value):
    try:
        v = int(value)
    except ValueError:
        v = 0
    if v <= 0:
        raise TorqError(f"--preprocess: {key}={value} must be a positive integer")
    return v


def _floats(key, value):
    try:
        vals = tuple(float(v) for v in value.split("/"))
    except ValueError:
        raise TorqError(f"--preprocess: {key}={value}: expected a number or R/G/B numbers") from None
    if len(vals) not in (1, 3):
        raise TorqError(f"--preprocess: {key}={value}: give one value or three (R/G/B)")
    return vals


def _choice(key, value, choices):
    if value.lower() not in choices:
        raise TorqError(f"--preprocess: {key}={value}: choose one of {', '.join(choices)}")
    return value.lower()


def _as_uint8(raw: np.ndarray) -> np.ndarray:
    a = np.asarray(raw)
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[2] not in (1, 3):
        a = a.transpose(1, 2, 0)           # C×H×W arrays (npz) -> H×W×C
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3):
        raise TorqError(f"an image must be H×W gray or H×W×3 RGB, got shape {a.shape}")
    if a.dtype != np.uint8:
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
    return a


def _to_channels(img: np.ndarray, channels: int) -> np.ndarray:
    if img.ndim == 2:
        return np.repeat(img[..., None], channels, axis=2)
    if channels == 1:
        gray = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        return np.clip(np.rint(gray), 0, 255).astype(np.uint8)[..., None]
    return img


def _resize_short(img: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image
    h, w = img.shape[:2]
    if min(h, w) == size:
        return img
    nh, nw = (size, max(1, round(w * size / h))) if h <= w else (max(1, round(h * size / w)), size)
    pil = Image.fromarray(img[..., 0] if img.shape[2] == 1 else img)
    out = np.asarray(pil.resize((nw, nh), Image.BILINEAR))
    return out[..., None] if out.ndim == 2 else out


def _centre_crop(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    if h < size or w < size:
        raise TorqError(f"cannot centre-crop {size}×{size} from a {h}×{w} image: resize first (resize={size})")
    top, left = (h - size) // 2, (w - size) // 2
    return img[top:top + size, left:left + size]
