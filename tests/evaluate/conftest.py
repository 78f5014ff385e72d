"""Fixtures for the evaluate tests: real data from installed packages or ../shared/data."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from . import fmnist_probe

def _shared_imagenet() -> Path:
    """$TORQ_IMAGENET_SAMPLE, else shared/data/imagenet-sample beside the checkout (CI,
    /work/main) or further up (worktrees)."""
    if os.environ.get("TORQ_IMAGENET_SAMPLE"):
        return Path(os.environ["TORQ_IMAGENET_SAMPLE"])
    for parent in Path(__file__).resolve().parents[2].parents:
        if (parent / "shared" / "data" / "imagenet-sample").is_dir():
            return parent / "shared" / "data" / "imagenet-sample"
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "imagenet-sample"


IMAGENET_SAMPLE = _shared_imagenet()


def need_fmnist():
    if not fmnist_probe.TRAIN.exists():
        pytest.skip("Debian package dataset-fashion-mnist is not installed (make test installs it where apt-get may: apt-get install -y dataset-fashion-mnist)")


@pytest.fixture(scope="session")
def probe_model(tmp_path_factory) -> Path:
    need_fmnist()
    return fmnist_probe.build(tmp_path_factory.mktemp("probe") / "fmnist_probe.onnx")


@pytest.fixture
def imagenet20(tmp_path) -> Path:
    """A 20-image copy of the ImageNet-sample folder (its labels.tsv format)."""
    if not (IMAGENET_SAMPLE / "labels.tsv").exists():
        pytest.skip(f"{IMAGENET_SAMPLE} is absent (ImageNet-sample images with labels.tsv: "
                    "TORQ_IMAGENET_SAMPLE=DIR make test)")
    lines = (IMAGENET_SAMPLE / "labels.tsv").read_text().splitlines()[:21]
    folder = tmp_path / "imagenet20"
    folder.mkdir()
    for line in lines[1:]:
        shutil.copy(IMAGENET_SAMPLE / line.split("\t")[0], folder)
    (folder / "labels.tsv").write_text("\n".join(lines) + "\n")
    return folder
