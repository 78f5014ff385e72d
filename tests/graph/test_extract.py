"""Layer/segment extraction: every piece is a valid model and reproduces the full model exactly."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from qmodels import (all_intermediates, conv_relu_pool_model, model, rand_input,
                          reshape_subgraph_model, run, vi, weight)
from torq.errors import TorqError
from torq.examples import build_cnn20, build_example_cnn
from torq.graph import extract_layers, extract_segment, signature, signature_json


def _check_reproduces(full_tensors, m):
    """Run a layer/segment on the full model's tensors; its outputs must match bit for bit."""
    onnx.checker.check_model(m)
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    inits = {t.name for t in m.graph.initializer}
    feeds = {v.name: full_tensors[v.name] for v in m.graph.input if v.name not in inits}
    got = run(m, feeds, disable_opt=True)
    assert got
    for name, val in got.items():
        np.testing.assert_array_equal(val, full_tensors[name], err_msg=name)


def test_example_cnn_layers_reproduce_full_model():
    m = build_example_cnn()
    full = all_intermediates(m, {"input": rand_input((1, 3, 32, 32))})
    layers = extract_layers(m)
    assert [l.id for l in layers] == [
        "Conv_conv1", "Relu_relu1", "Conv_conv2", "Relu_relu2", "Conv_conv3", "Add_add1",
        "MaxPool_pool1", "Conv_dwconv", "GlobalAveragePool_gap", "Flatten_flatten", "Gemm_logits"]
    assert [l.node_index for l in layers] == list(range(11))
    for layer in layers:
        assert layer.model.graph.node[0].op_type == layer.op_type
        _check_reproduces(full, layer.model)
    # original initializers stay initializers (weights are not turned into inputs)
    conv1 = layers[0].model.graph
    assert {t.name for t in conv1.initializer} == {"conv1.weight", "conv1.bias"}
    assert [v.name for v in conv1.input] == ["input"]


def test_shape_subgraph_is_folded_and_every_layer_reproduces():
    m = reshape_subgraph_model()  # dynamic batch "N" and Constant nodes
    x = rand_input((1, 3, 4, 4))
    full = all_intermediates(m, {"x": x})
    layers = extract_layers(m)
    # Constant nodes are skipped; node_index counts the non-Constant nodes only
    assert [l.op_type for l in layers] == ["Conv", "Shape", "Gather", "Unsqueeze", "Concat",
                                           "Reshape", "MatMul"]
    assert [l.node_index for l in layers] == list(range(7))
    for layer in layers:
        _check_reproduces(full, layer.model)
    reshape = next(l for l in layers if l.op_type == "Reshape").model.graph
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in reshape.initializer}
    assert list(inits["newshape"]) == [1, -1]
    assert [v.name for v in reshape.input] == ["c1"]
    dims = [d.dim_value for d in reshape.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 2, 4, 4]  # dynamic batch fixed to 1


def test_layers_of_quantized_models_are_valid():
    from torq.quantize import quantize
    q = quantize(build_example_cnn(), quant_format="qoperator", full_integer=True)
    x = np.random.default_rng(0).integers(-128, 128, (1, 3, 32, 32)).astype(np.int8)
    full = all_intermediates(q, {"input": x})
    for layer in extract_layers(q):
        inits = {t.name for t in layer.model.graph.initializer}
        feeds = {v.name: full[v.name] for v in layer.model.graph.input if v.name not in inits}
        for name, val in run(layer.model, feeds, disable_opt=True).items():
            if name in full:
                np.testing.assert_array_equal(val, full[name], err_msg=name)


def _conv(stride=1, pads=(0, 0, 0, 0), seed=0):
    out = (8 + pads[0] + pads[2] - 3) // stride + 1
    return model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride, stride], pads=list(pads))],
                 [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, out, out])], [weight("w", (4, 3, 3, 3), seed)])


def test_signature_equal_for_identical_layers_and_attribute_sensitive():
    assert signature(_conv(seed=0)) == signature(_conv(seed=1))  # weights differ, layer does not
    assert signature(_conv(stride=1)) != signature(_conv(stride=2))
    # strides alone (output shapes left undeclared so nothing else differs)
    s1, s2 = _conv(stride=1), _conv(stride=2)
    for m in (s1, s2):
        m.graph.output[0].type.tensor_type.ClearField("shape")
    assert signature(s1)[:-1] == signature(s2)[:-1]
    assert signature(s1) != signature(s2)
    # same I/O shapes, ops and weights shapes; only strides+pads differ -> still different layers
    a, b = _conv(stride=1, pads=(0, 0, 0, 0)), _conv(stride=2, pads=(3, 3, 3, 3))
    assert [d.dim_value for d in a.graph.output[0].type.tensor_type.shape.dim] == \
        [d.dim_value for d in b.graph.output[0].type.tensor_type.shape.dim]
    assert signature(a) != signature(b)
    hash(signature(a))
    assert json.loads(signature_json(a))


def test_cnn20_duplicate_blocks_share_signatures():
    layers = extract_layers(build_cnn20())
    sigs = {l.id: signature(l.model) for l in layers}
    assert sigs["Conv_s1b1_conv2"] == sigs["Conv_s1b2_conv1"]  # 16->16 3x3 s1 at the same size
    assert sigs["Conv_s2b1_conv1"] != sigs["Conv_s2b2_conv1"]  # stride 2 vs 1, different cin
    assert len(set(sigs.values())) < len(layers)


@pytest.mark.parametrize("selector", [[2, 3, 4], ["conv2", "relu2", "conv3"],
                                      ["Conv_conv2", "Relu_relu2", "Conv_conv3"]])
def test_segment_of_three_nodes_reproduces(selector):
    m = build_example_cnn()
    full = all_intermediates(m, {"input": rand_input((1, 3, 32, 32), seed=3)})
    seg = extract_segment(m, selector)
    assert [n.op_type for n in seg.graph.node] == ["Conv", "Relu", "Conv"]
    assert [v.name for v in seg.graph.input] == ["relu1"]
    # relu2 is read by the Add outside the segment, conv3 too
    assert sorted(o.name for o in seg.graph.output) == ["conv3", "relu2"]
    _check_reproduces(full, seg)


def test_segments_of_quantized_model_cut_at_an_int8_tensor():
    """Cut a full-integer QDQ model at the int8 tensor after the first Conv: A then B == whole."""
    from torq.quantize import quantize
    q = quantize(conv_relu_pool_model(), quant_format="qdq", full_integer=True)
    nodes = list(q.graph.node)
    cut = next(n.output[0] for n in nodes if n.op_type == "QuantizeLinear")  # Conv1 output, int8
    producers = {o: i for i, n in enumerate(nodes) for o in n.output}
    inits = {t.name for t in q.graph.initializer}

    def upstream(t, acc):  # every node needed to compute tensor t
        if t in producers and producers[t] not in acc:
            acc.add(producers[t])
            for x in nodes[producers[t]].input:
                upstream(x, acc)
        return acc
    a = upstream(cut, set())
    b = sorted(set(range(len(nodes))) - a)
    # weight DQs read only initializers: B needs its own copies of the ones it uses
    b += [i for i in a if nodes[i].op_type == "DequantizeLinear" and nodes[i].input[0] in inits
          and any(nodes[i].output[0] in nodes[j].input for j in b)]
    seg_a, seg_b = extract_segment(q, sorted(a)), extract_segment(q, sorted(set(b)))
    assert [o.name for o in seg_a.graph.output] == [cut]
    assert seg_a.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    assert [v.name for v in seg_b.graph.input if v.name not in inits] == [cut]
    x = np.random.default_rng(0).integers(-128, 128, (1, 3, 8, 8)).astype(np.int8)
    mid = run(seg_a, {"x": x})[cut]
    np.testing.assert_array_equal(run(seg_b, {cut: mid})["y"], run(q, {"x": x})["y"])


def test_bad_segment_selectors():
    m = build_example_cnn()
    with pytest.raises(TorqError, match="no node named 'nope'"):
        extract_segment(m, ["nope"])
    with pytest.raises(TorqError, match="out of range"):
        extract_segment(m, [99])
    with pytest.raises(TorqError, match="at least one"):
        extract_segment(m, [])
