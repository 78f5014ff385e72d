"""``--weight-rounding gptq``: the QDQ model keeps every scale and changes only int8 weight
integers, and those bring the model's output closer to FP32 on the calibration data."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from torq.errors import TorqError
from torq.examples import build_example_cnn
from torq.quantize import Recipe, apply
from torq.quantize.calibration import make_reader
from torq.quantize.sensitivity import samples_of

BASE = Recipe(per_channel=True, exact_scales=True, num_calib=16)


def _run(model, samples):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, s)[0] for s in samples])


def _inits(m):
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


@pytest.fixture(scope="module")
def models():
    fp32 = build_example_cnn()
    near, gptq = apply(BASE, fp32), apply(BASE.replace(weight_rounding="gptq"), fp32)
    return fp32, near, gptq


def test_only_weight_integers_change(models):
    _, near, gptq = models
    a, b = _inits(near.model), _inits(gptq.model)
    assert a.keys() == b.keys()
    changed = [k for k in a if not np.array_equal(a[k], b[k])]
    assert changed and all(a[k].dtype == np.int8 and k.endswith("_quantized") for k in changed)
    assert all(np.abs(b[k]).max() <= 127 for k in changed)
    assert [n.op_type for n in near.model.graph.node] == [n.op_type for n in gptq.model.graph.node]


def test_closer_to_fp32_on_the_calibration_data(models):
    fp32, near, gptq = models
    samples = samples_of(make_reader(near.fp32, BASE))
    ref = _run(near.fp32, samples)
    err_near = np.mean((_run(near.model, samples) - ref) ** 2)
    err_gptq = np.mean((_run(gptq.model, samples) - ref) ** 2)
    assert err_gptq < 0.8 * err_near, (err_gptq, err_near)


def test_unknown_rounding_is_a_one_line_error():
    with pytest.raises(TorqError, match="--weight-rounding"):
        Recipe(weight_rounding="adaround")


def test_rounded_model_is_bit_exact_on_the_nss():
    """Only integers changed: with exact scales the NSS's native rounding still equals ORT's."""
    from torq import compile
    from torq.verify import verify
    q = apply(BASE.replace(weight_rounding="gptq", full_integer=True), build_example_cnn()).model
    r = verify(compile(q), seed=0)
    assert r.ok and r.float_steps == 0
    assert all(o.exact for o in r.outputs), [str(o) for o in r.outputs]


def test_a_layer_seeing_fewer_rows_than_inputs_keeps_nearest_rounding():
    """4 images give the classifier (8 inputs, one row per image) a singular H: GPTQ would fit
    those 4 images, so its weights stay nearest; the convs (hundreds of rows each) are re-rounded."""
    few = BASE.replace(num_calib=4)
    fp32 = build_example_cnn()
    a, b = _inits(apply(few, fp32).model), _inits(apply(few.replace(weight_rounding="gptq"), fp32).model)
    changed = {k for k in a if not np.array_equal(a[k], b[k])}
    gemm = next(n for n in fp32.graph.node if n.op_type == "Gemm").input[1] + "_quantized"
    assert gemm in a and gemm not in changed
    assert changed
