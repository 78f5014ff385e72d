"""Built-in example models, built with onnx.helper from seeded numpy weights.

They exist so that the demo, the tests and the benchmarks need no download and no torch:
every call returns the same bytes (fixed seeds, fixed names, opset 17).
May import: torq.fileio.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .fileio import save_model

OPSET = 17


class _Builder:
    """Tiny graph builder: keeps nodes/initializers in order and names tensors after nodes."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple[int, ...], fan_in: int) -> str:
        w = self.rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        self.inits.append(numpy_helper.from_array(w, name))
        return name

    def bias(self, name: str, n: int) -> str:
        b = (self.rng.standard_normal(n) * 0.1).astype(np.float32)
        self.inits.append(numpy_helper.from_array(b, name))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, out: str, cin: int, cout: int, k: int, stride: int = 1,
             group: int = 1) -> str:
        w = self.weight(f"{out}.weight", (cout, cin // group, k, k), fan_in=cin // group * k * k)
        b = self.bias(f"{out}.bias", cout)
        pad = k // 2
        return self.node("Conv", [x, w, b], out, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[pad] * 4, group=group)

    def head(self, x: str, cin: int, classes: int) -> str:
        """GlobalAveragePool -> Flatten -> Gemm(classes) -> `logits`."""
        g = self.node("GlobalAveragePool", [x], "gap")
        f = self.node("Flatten", [g], "flatten", axis=1)
        w = self.weight("fc.weight", (classes, cin), fan_in=cin)
        b = self.bias("fc.bias", classes)
        return self.node("Gemm", [f, w, b], "logits", transB=1)

    def model(self, name: str, in_shape: list[int], out_shape: list[int]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out_shape)],
            self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="torq.examples")
        m.ir_version = 8  # opset 17 <-> IR 8: loadable by every ORT >= 1.13
        onnx.checker.check_model(m, full_check=True)
        return m


def _finish(m: onnx.ModelProto, path: str | os.PathLike | None) -> onnx.ModelProto:
    if path is not None:
        save_model(m, path)
    return m


def build_example_cnn(path: str | os.PathLike | None = None) -> onnx.ModelProto:
    """The demo model: one of each op the NPU path cares about, small enough to simulate fast.

    input[1,3,32,32] -> Conv3x3+Relu -> Conv3x3/s2+Relu -> Conv1x1 + residual Add -> MaxPool2x2
    -> depthwise Conv3x3 (group 8) -> GlobalAveragePool -> Flatten -> Gemm(10) -> logits[1,10]."""
    b = _Builder(seed=0)
    x = b.node("Relu", [b.conv("input", "conv1", 3, 8, 3)], "relu1")
    x = b.node("Relu", [b.conv(x, "conv2", 8, 8, 3, stride=2)], "relu2")
    x = b.node("Add", [b.conv(x, "conv3", 8, 8, 1), x], "add1")
    x = b.node("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    x = b.conv(x, "dwconv", 8, 8, 3, group=8)
    b.head(x, 8, 10)
    return _finish(b.model("torq_example_cnn", [1, 3, 32, 32], [1, 10]), path)


def build_cnn20(path: str | os.PathLike | None = None) -> onnx.ModelProto:
    """A ResNet-ish CNN with 20 Conv layers at 3x64x64, used to time quantization and compilation.

    stem Conv3x3/s2 (16ch) + 4 stages x 2 basic blocks (16, 32, 64, 128 channels; stages 2-4 start
    with stride 2 and a 1x1 projection) -> GlobalAveragePool -> Flatten -> Gemm(10)."""
    b = _Builder(seed=20)
    x = b.node("Relu", [b.conv("input", "stem", 3, 16, 3, stride=2)], "stem_relu")
    cin = 16
    for s, cout in enumerate([16, 32, 64, 128], start=1):
        for blk in (1, 2):
            stride = 2 if (s > 1 and blk == 1) else 1
            p = f"s{s}b{blk}"
            y = b.node("Relu", [b.conv(x, f"{p}_conv1", cin, cout, 3, stride=stride)], f"{p}_relu1")
            y = b.conv(y, f"{p}_conv2", cout, cout, 3)
            skip = b.conv(x, f"{p}_proj", cin, cout, 1, stride=stride) if stride != 1 or cin != cout else x
            x = b.node("Relu", [b.node("Add", [y, skip], f"{p}_add")], f"{p}_out")
            cin = cout
    b.head(x, cin, 10)
    return _finish(b.model("torq_cnn20", [1, 3, 64, 64], [1, 10]), path)
