"""A real classifier with a Softmax head (PaddleOCR's text-direction classifier, `make realworld`):
quantized in the three formats of the realworld table, `torq-compile --verify-against-ort` passes
with nothing unsupported, the Softmax running on the NSS as a bf16 island."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TORQ_REALWORLD_MODELS", ROOT / "build" / "realworld" / "models"))
PPOCR = MODELS / "ppocr_cls.onnx"
FLAGS = {"qdq": ["--per-tensor"], "qdq-pc": ["--per-channel"], "qoperator": ["--quant-format", "qoperator"]}


def cli(module: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True, env=env)


@pytest.mark.slow
@pytest.mark.skipif(not PPOCR.exists(), reason="make realworld (or TORQ_REALWORLD_MODELS=<dir with ppocr_cls.onnx>)")
@pytest.mark.parametrize("flags", list(FLAGS))
def test_ppocr_cls_verifies_whole_with_its_softmax_as_a_bf16_island(flags, tmp_path):
    q = tmp_path / "q.onnx"
    r = cli("torq.gen_config.cli", "quantize", "--model", PPOCR, "-o", q, "--recipe", "ort",
            "--input-shape", "x=1,3,48,192", *FLAGS[flags])
    assert r.returncode == 0, r.stderr
    r = cli("torq.compile_cli", q, "--verify-against-ort")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr
    assert "1 op in bf16 (no integer form): Softmax ×1" in r.stdout
    assert "not supported" not in r.stdout + r.stderr
