"""A small real classifier for the evaluate tests: fixed conv features + a ridge-regression head
fitted in numpy on 2000 Fashion-MNIST *train* images (Debian ``dataset-fashion-mnist``).

Conv(1→8, 5×5, stride 2) → Relu → MaxPool 2 → Flatten → Gemm(→10); input N×1×28×28, pixels
scaled to [0, 1] (``--preprocess norm=unit``). About 75 % test accuracy: good enough that top-1
means something, small enough to build in about a second.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FMNIST = Path("/usr/share/datasets/fashion-mnist")
TRAIN = FMNIST / "train-images-idx3-ubyte.gz"
TEST = FMNIST / "t10k-images-idx3-ubyte.gz"
TRAIN_IMAGES = 2000


def _features(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The conv/relu/maxpool/flatten part in numpy (float64), matching the ONNX graph."""
    n = len(x)
    pad = np.pad(x[:, 0], ((0, 0), (2, 2), (2, 2)))
    cols = np.stack([pad[:, i:i + 28:2, j:j + 28:2] for i in range(5) for j in range(5)], axis=-1)  # n,14,14,25
    conv = np.maximum(cols @ w.reshape(8, 25).T + b, 0)                                        # n,14,14,8
    pooled = conv.reshape(n, 7, 2, 7, 2, 8).max(axis=(2, 4))                                   # n,7,7,8
    return pooled.transpose(0, 3, 1, 2).reshape(n, -1)


def build(path: Path) -> Path:
    from torq.data.datasets import load_dataset
    train = load_dataset(TRAIN)
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.4, (8, 1, 5, 5)).astype(np.float32)
    b = rng.normal(0, 0.1, 8).astype(np.float32)
    x = np.stack([train.load(i) for i in range(TRAIN_IMAGES)])[:, None].astype(np.float64) / 255
    f = _features(x, w, b)
    f1 = np.hstack([f, np.ones((len(f), 1))])
    onehot = np.eye(10)[train.labels[:TRAIN_IMAGES]]
    coef = np.linalg.solve(f1.T @ f1 + 1.0 * np.eye(f1.shape[1]), f1.T @ onehot)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(coef[:-1].astype(np.float32), "fc_w"),
             numpy_helper.from_array(coef[-1].astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], kernel_shape=[5, 5], strides=[2, 2],
                              pads=[2, 2, 2, 2]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"])]
    graph = helper.make_graph(nodes, "fmnist_probe",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 28, 28])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
