"""Well-known CNN architectures with deterministic random weights, built with onnx.helper + numpy.

These are **architecture stand-ins**: the graphs have the layer structure, shapes and op mix of
the real networks (so tests and benchmarks exercise what deployed models exercise, and MAC counts
match), but the weights are seeded random numbers. They are for tests and benchmarks only; their
outputs mean nothing, so never use them to judge quantization *accuracy*.

Weights emulate a trained network after BatchNorm folding: He-normal conv kernels, then a random
per-output-channel gain (the folded BN scale, log-uniform in [0.5, 2]) and a small random bias.
The per-channel gains make per-channel quantization genuinely different from per-tensor.
The last conv of every residual branch is scaled down so that activations stay O(1) through the
whole depth instead of growing with every residual Add.

Every call with the same arguments returns the same bytes (opset 17, IR 8, float32, no torch).
May import: nothing from torq.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17

__all__ = ["resnet18", "mobilenet_v2"]


class _Graph:
    """Minimal sequential graph builder; tensor names follow node names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[float, str] = {}

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32), name))
        return name

    def const(self, v: float) -> str:
        """A shared scalar float initializer (Clip bounds)."""
        if v not in self._consts:
            self._consts[v] = self.init(f"const_{v:g}".replace("-", "m").replace(".", "p"),
                                        np.array(v, np.float32))
        return self._consts[v]

    def node(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1,
             group: int = 1, gain: float = 1.0) -> str:
        """Conv with folded-BN weights: He-normal * per-channel gain * `gain`, small bias."""
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)
        bn = np.exp(self.rng.uniform(np.log(0.5), np.log(2.0), cout))   # folded BN gamma/sigma
        w = w * (bn / np.sqrt(np.mean(bn ** 2)) * gain)[:, None, None, None]
        b = self.rng.standard_normal(cout) * 0.05
        return self.node("Conv", [x, self.init(f"{name}.weight", w), self.init(f"{name}.bias", b)], name,
                         kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def relu6(self, x: str, name: str) -> str:
        return self.node("Clip", [x, self.const(0.0), self.const(6.0)], name)

    def head(self, x: str, cin: int, classes: int) -> str:
        """GlobalAveragePool -> Flatten -> Gemm(classes) -> `logits`."""
        g = self.node("GlobalAveragePool", [x], "gap")
        f = self.node("Flatten", [g], "flatten", axis=1)
        w = self.rng.standard_normal((classes, cin)) * np.sqrt(1.0 / cin)
        b = self.rng.standard_normal(classes) * 0.01
        return self.node("Gemm", [f, self.init("fc.weight", w), self.init("fc.bias", b)], "logits", transB=1)

    def model(self, name: str, hw: int, classes: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
            self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="torq.zoo")
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m


def _check_hw(hw: int, minimum: int) -> None:
    if not isinstance(hw, (int, np.integer)) or hw < minimum:
        raise ValueError(f"hw must be an int >= {minimum}, got {hw!r}")


def resnet18(hw: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 architecture stand-in with random (BN-folded) weights -- for tests/benchmarks, not accuracy.

    input [1,3,hw,hw] -> Conv7x7/2 (64) + Relu -> MaxPool3x3/2 (pads 1) -> 4 stages x 2 BasicBlocks
    (64, 128, 256, 512 channels; stages 2-4 open with stride 2 and a 1x1/2 downsample conv on the
    shortcut; block = Conv3x3 + Relu -> Conv3x3 -> Add(shortcut) -> Relu) -> GlobalAveragePool ->
    Flatten -> Gemm -> logits [1,1000]. 20 Conv, 8 Add, 17 Relu, no BatchNormalization.
    hw >= 32 (the net downsamples by 32)."""
    _check_hw(hw, 32)
    g = _Graph(seed)
    x = g.relu(g.conv("input", "conv1", 3, 64, 7, stride=2), "relu1")
    x = g.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate([64, 128, 256, 512], start=1):
        for blk in range(2):
            p = f"layer{stage}.{blk}"
            stride = 2 if (stage > 1 and blk == 0) else 1
            y = g.relu(g.conv(x, f"{p}.conv1", cin, cout, 3, stride=stride), f"{p}.relu1")
            # Residual branch damped (like a small folded-BN gamma) so the sum stays O(1).
            y = g.conv(y, f"{p}.conv2", cout, cout, 3, gain=0.5)
            skip = g.conv(x, f"{p}.downsample", cin, cout, 1, stride=stride) if stride != 1 or cin != cout else x
            x = g.relu(g.node("Add", [y, skip], f"{p}.add"), f"{p}.relu2")
            cin = cout
    g.head(x, cin, 1000)
    return g.model("resnet18", hw, 1000)


# (expansion t, output channels c, repeats n, first stride s) -- MobileNetV2 paper, Table 2.
MOBILENET_V2_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of 8, never below 90% of v (the reference implementation's rule)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def mobilenet_v2(hw: int = 224, width: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 architecture stand-in with random (BN-folded) weights -- for tests/benchmarks, not accuracy.

    input [1,3,hw,hw] -> Conv3x3/2 (32·width) + ReLU6 -> 17 inverted residual blocks from the
    standard (t, c, n, s) table (1x1 expand conv + ReLU6 when t != 1, 3x3 depthwise conv with
    group = channels + ReLU6, 1x1 linear projection conv, residual Add when stride 1 and
    in == out channels) -> Conv1x1 (1280, or 1280·width when width > 1) + ReLU6 ->
    GlobalAveragePool -> Flatten -> Gemm -> logits [1,1000]. ReLU6 is Clip(0, 6).
    At width 1.0: 52 Conv (17 depthwise), 10 Add, 35 Clip. hw >= 32; hw = 96 is a fast test size."""
    _check_hw(hw, 32)
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width!r}")
    g = _Graph(seed)
    cin = _make_divisible(32 * width)
    x = g.relu6(g.conv("input", "features.0", 3, cin, 3, stride=2), "features.0.relu6")
    idx = 1
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        cout = _make_divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            p = f"features.{idx}"
            hidden = cin * t
            y = x
            if t != 1:
                y = g.relu6(g.conv(y, f"{p}.expand", cin, hidden, 1), f"{p}.expand.relu6")
            y = g.relu6(g.conv(y, f"{p}.dw", hidden, hidden, 3, stride=stride, group=hidden), f"{p}.dw.relu6")
            residual = stride == 1 and cin == cout
            # Linear bottleneck (no activation); damped on residual blocks so the sum stays O(1).
            y = g.conv(y, f"{p}.project", hidden, cout, 1, gain=0.5 if residual else 1.0)
            x = g.node("Add", [x, y], f"{p}.add") if residual else y
            cin = cout
            idx += 1
    last = _make_divisible(1280 * width) if width > 1.0 else 1280
    x = g.relu6(g.conv(x, f"features.{idx}", cin, last, 1), f"features.{idx}.relu6")
    g.head(x, last, 1000)
    return g.model("mobilenet_v2", hw, 1000)
