"""Bias correction moves the int8-weight model's mean output back onto the fp32 one."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from torq.quantize.bias_correction import _weight_error, correct_bias


class _Reader:
    def __init__(self, xs):
        self.xs, self.i = xs, 0

    def get_next(self):
        self.i += 1
        return {"x": self.xs[self.i - 1]} if self.i <= len(self.xs) else None

    def rewind(self):
        self.i = 0


def _model(w, b, group):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, 8, 8])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _mean_out(model, xs):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.mean([s.run(None, {"x": x})[0].mean(axis=(0, 2, 3)) for x in xs], axis=0)


def test_bias_correction_removes_the_mean_shift():
    rng = np.random.default_rng(0)
    for group, w_shape in ((1, (6, 4, 3, 3)), (4, (4, 1, 3, 3))):        # dense and depthwise
        w = rng.normal(0, 1, w_shape).astype(np.float32)
        w[0, 0, 0, 0] = 40.0                                           # per-tensor scale -> big rounding error
        b = rng.normal(0, 1, w_shape[0]).astype(np.float32)
        xs = [(rng.normal(3.0, 1.0, (1, 4, 8, 8))).astype(np.float32) for _ in range(8)]
        fp32 = _model(w, b, group)
        wq = (w + _weight_error(w.astype(np.float64), per_channel=False)).astype(np.float32)
        plain = _mean_out(_model(wq, b, group), xs) - _mean_out(fp32, xs)
        fixed = correct_bias(fp32, _Reader(xs), per_channel=False)
        fixed_b = numpy_helper.to_array(next(t for t in fixed.graph.initializer if t.name == "b"))
        corrected = _mean_out(_model(wq, fixed_b, group), xs) - _mean_out(fp32, xs)
        # only the zero-padded border keeps a residual: well under the uncorrected shift
        assert np.abs(corrected).max() < 0.35 * np.abs(plain).max(), (group, plain, corrected)
        assert onnx.checker.check_model(fixed) is None
