"""Small fp32 stand-ins of real architectures (seeded weights, opset 17), for tests that run
whole models through many executor maps: a ResNet-style and an EfficientNet-style CNN."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op, inputs, out, **attrs):
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x, out, cin, cout, k, stride=1, group=1, pad=None):
        fan = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan)
        w *= np.exp(self.rng.uniform(-0.7, 0.7, (cout, 1, 1, 1)))      # folded-BN gains
        self.const(f"{out}.w", w.astype(np.float32))
        self.const(f"{out}.b", (self.rng.standard_normal(cout) * 0.1).astype(np.float32))
        p = k // 2 if pad is None else pad
        return self.node("Conv", [x, f"{out}.w", f"{out}.b"], out, kernel_shape=[k, k],
                         strides=[stride, stride], pads=[p] * 4, group=group)

    def relu6(self, x, out):
        lo, hi = self.const(f"{out}.lo", np.float32(0)), self.const(f"{out}.hi", np.float32(6))
        return self.node("Clip", [x, lo, hi], out)

    def pad(self, x, out, pads):
        return self.node("Pad", [x, self.const(f"{out}.pads", np.array(pads, np.int64))], out)

    def head(self, x, cin, classes=10):
        g = self.node("GlobalAveragePool", [x], "gap")
        f = self.node("Flatten", [g], "flat", axis=1)
        self.const("fc.w", (self.rng.standard_normal((classes, cin)) / np.sqrt(cin)).astype(np.float32))
        self.const("fc.b", np.zeros(classes, np.float32))
        return self.node("Gemm", [f, "fc.w", "fc.b"], "logits", transB=1)

    def model(self, name, shape, classes=10):
        g = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [shape[0], classes])],
                              self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m


def resnet_style() -> onnx.ModelProto:
    """Conv+Relu stem, MaxPool 3x3/2, an identity basic block, a strided block with a 1x1
    projection, GlobalAveragePool, Gemm."""
    n = _Net(11)
    x = n.node("Relu", [n.conv("input", "stem", 3, 8, 3)], "stem_relu")
    x = n.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = n.node("Relu", [n.conv(x, "b1c1", 8, 8, 3)], "b1r1")
    x = n.node("Relu", [n.node("Add", [n.conv(y, "b1c2", 8, 8, 3), x], "b1add")], "b1out")
    y = n.node("Relu", [n.conv(x, "b2c1", 8, 16, 3, stride=2)], "b2r1")
    skip = n.conv(x, "b2proj", 8, 16, 1, stride=2)
    x = n.node("Relu", [n.node("Add", [n.conv(y, "b2c2", 16, 16, 3), skip], "b2add")], "b2out")
    n.head(x, 16)
    return n.model("resnet_style", [1, 3, 16, 16])


def efficientnet_style(input_pad: bool = True) -> onnx.ModelProto:
    """TF-"same" Pads (the stem's reads the graph input), Conv/2 + ReLU6, an MBConv with a
    residual Add (1x1 expand, depthwise 3x3, 1x1 project), a strided MBConv, 1x1 head, GAP, Gemm."""
    n = _Net(12)
    x = n.pad("input", "stem_pad", [0, 0, 0, 0, 0, 0, 1, 1]) if input_pad else "input"
    x = n.relu6(n.conv(x, "stem", 3, 8, 3, stride=2, pad=0 if input_pad else 1), "stem_act")
    y = n.relu6(n.conv(x, "m1exp", 8, 16, 1), "m1exp_act")
    y = n.relu6(n.conv(n.pad(y, "m1pad", [0, 0, 1, 1, 0, 0, 1, 1]), "m1dw", 16, 16, 3, group=16, pad=0), "m1dw_act")
    x = n.node("Add", [n.conv(y, "m1proj", 16, 8, 1), x], "m1add")
    y = n.relu6(n.conv(x, "m2exp", 8, 24, 1), "m2exp_act")
    y = n.relu6(n.conv(n.pad(y, "m2pad", [0, 0, 0, 0, 0, 0, 1, 1]), "m2dw", 24, 24, 3, stride=2, group=24, pad=0),
                "m2dw_act")
    x = n.conv(y, "m2proj", 24, 12, 1)
    x = n.relu6(n.conv(x, "head", 12, 16, 1), "head_act")
    n.head(x, 16)
    return n.model("efficientnet_style", [1, 3, 16, 16])


def realworld_style() -> onnx.ModelProto:
    """What the real exports of ``make realworld`` bring: PRelu and a ceil-mode MaxPool (MTCNN),
    a squeeze-excite gate with HardSigmoid (PP-OCR, MobileNetV3), torchvision's ``x.mean(3).mean(2)``
    head as two single-axis ReduceMeans (deep-sort's MobileNetV2), a Gemm and a Softmax tail; two
    BN-folded "dust" channels (1e-6 of the layer's weights) in the first conv."""
    n = _Net(13)
    c1 = n.conv("input", "c1", 3, 8, 3)
    w, b = n.inits[-2], n.inits[-1]
    scale = np.array([1e-6, 1e-6] + [1] * 6, np.float32)
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * scale[:, None, None, None], w.name))
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b) * scale, b.name))
    x = n.node("PRelu", [c1, n.const("c1.slope", np.full((8, 1, 1), 0.25, np.float32))], "c1_prelu")
    x = n.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    x = n.node("Relu", [n.conv(x, "c2", 8, 16, 3)], "c2_relu")
    g = n.node("GlobalAveragePool", [x], "se_gap")
    g = n.node("Relu", [n.conv(g, "se_down", 16, 4, 1)], "se_relu")
    g = n.node("HardSigmoid", [n.conv(g, "se_up", 4, 16, 1)], "se_gate", alpha=0.2, beta=0.5)
    x = n.node("Mul", [x, g], "se_mul")
    x = n.node("PRelu", [n.conv(x, "c3", 16, 16, 3), n.const("c3.slope", np.full((16, 1, 1), 0.1, np.float32))],
               "c3_prelu")
    x = n.node("ReduceMean", [n.node("ReduceMean", [x], "mean3", axes=[3], keepdims=0)], "mean2", axes=[2], keepdims=0)
    n.const("fc.w", (n.rng.standard_normal((10, 16)) / 4).astype(np.float32))
    n.const("fc.b", np.zeros(10, np.float32))
    n.node("Softmax", [n.node("Gemm", [x, "fc.w", "fc.b"], "fc", transB=1)], "logits", axis=1)
    return n.model("realworld_style", [1, 3, 24, 24])
