"""gen_config tests: small models, one shared result cache per session, CLI called in process."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    old = os.environ.get("TORQ_GEN_CONFIG_CACHE_DIR")
    os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = str(tmp_path_factory.mktemp("gen_config_cache"))
    yield
    if old is None:
        os.environ.pop("TORQ_GEN_CONFIG_CACHE_DIR", None)
    else:
        os.environ["TORQ_GEN_CONFIG_CACHE_DIR"] = old


def cli(*argv) -> int:
    from torq.gen_config.cli import main
    return main([str(a) for a in argv])


def conv_chain(path, middle: str | None = "LpNormalization"):
    """x[1,4,8,8] -> Conv3x3 -> <middle> -> Conv3x3 -> y  (fp32; both convs 4->4 so they dedup)."""
    rng = np.random.default_rng(7)
    nodes, inits, x = [], [], "x"
    for i in range(2):
        w, b = f"w{i}", f"b{i}"
        inits += [numpy_helper.from_array(rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32), w),
                  numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), b)]
        out = f"conv{i}"
        nodes.append(helper.make_node("Conv", [x, w, b], [out], name=out, pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
        x = out
        if i == 0 and middle:
            nodes.append(helper.make_node(middle, [x], ["mid"], name="mid"))
            x = "mid"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path
