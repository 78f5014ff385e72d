"""Quantization front end on real ONNX Runtime: formats, calibration sources, full-integer I/O."""
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader

from qmodels import (conv_reducemean_model, conv_relu_pool_model, model, rand_input, run, vi,
                          weight, zero_branch_model)
from torq.errors import TorqError
from torq.examples import build_example_cnn
from torq.quantize import SyntheticDataReader, quantize
from torq.graph.io_quant import io_quant_params

X = rand_input((1, 3, 32, 32), seed=7)


def ops(m):
    return Counter(n.op_type for n in m.graph.node)


def scales(m):
    """name -> value of every scale initializer."""
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer if t.name.endswith("_scale")}


def input_scale(q):
    """Scale of the QuantizeLinear that reads graph input 'input'."""
    qn = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input")
    return float(scales(q)[qn.input[1]])


@pytest.fixture(scope="module")
def cnn():
    return build_example_cnn()


@pytest.fixture(scope="module")
def fp32_out(cnn):
    return run(cnn, {"input": X})["logits"]


@pytest.mark.parametrize("fmt", ["qdq", "qoperator", "hybrid"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_formats_run_in_ort_and_stay_close_to_fp32(cnn, fp32_out, fmt, per_channel):
    q = quantize(cnn, quant_format=fmt, per_channel=per_channel)
    onnx.checker.check_model(q)
    out = run(q, {"input": X})["logits"]
    assert out.shape == (1, 10)
    # int8 everywhere: within a few output steps of fp32 on in-distribution data
    assert np.abs(out - fp32_out).max() < 0.1 * np.abs(fp32_out).max()
    c = ops(q)
    if fmt == "qoperator":
        assert c["QLinearConv"] == 4 and c["QGemm"] == 1 and c["QLinearAdd"] == 1
    else:  # qdq, and hybrid (the example has Gemm, so hybrid must pick QDQ)
        assert c["Conv"] == 4 and c["QuantizeLinear"] > 0 and not any(o.startswith("QLinear") for o in c)
        # MaxPool gets its own Q/DQ (ForceQuantizeNoInputCheck)
        mp = next(n for n in q.graph.node if n.op_type == "MaxPool")
        producer = {o: n for n in q.graph.node for o in n.output}
        assert producer[mp.input[0]].op_type == "DequantizeLinear"
        assert any(n.op_type == "QuantizeLinear" and mp.output[0] in n.input for n in q.graph.node)
    if per_channel:
        w_scales = [v for k, v in scales(q).items() if "conv1.weight" in k]
        assert w_scales and w_scales[0].shape == (8,)


@pytest.mark.parametrize("method", ["Entropy", "PERCENTILE", "minmax"])
def test_calibrate_methods(cnn, fp32_out, method):
    q = quantize(cnn, calibrate_method=method, num_calib=8)
    out = run(q, {"input": X})["logits"]
    assert np.abs(out - fp32_out).max() < 0.2 * np.abs(fp32_out).max()


def test_calibrate_methods_give_different_scales(cnn):
    a = quantize(cnn, calibrate_method="minmax", num_calib=8)
    b = quantize(cnn, calibrate_method="percentile", num_calib=8)
    assert input_scale(a) != input_scale(b)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_full_integer_io(cnn, fp32_out, fmt):
    q = quantize(cnn, quant_format=fmt, full_integer=True)
    (gi,), (go,) = q.graph.input, q.graph.output
    assert gi.name == "input" and go.name == "logits"  # original names kept
    assert gi.type.tensor_type.elem_type == onnx.TensorProto.INT8
    assert go.type.tensor_type.elem_type == onnx.TensorProto.INT8
    assert [d.dim_value for d in gi.type.tensor_type.shape.dim] == [1, 3, 32, 32]
    assert [d.dim_value for d in go.type.tensor_type.shape.dim] == [1, 10]
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "input" for n in q.graph.node)
    assert not any(n.op_type == "DequantizeLinear" and "logits" in n.output for n in q.graph.node)
    p = io_quant_params(q)
    si, zi = p["inputs"]["input"]["scale"], p["inputs"]["input"]["zero_point"]
    so, zo = p["outputs"]["logits"]["scale"], p["outputs"]["logits"]["zero_point"]
    xq = np.clip(np.round(X / si) + zi, -128, 127).astype(np.int8)
    yq = run(q, {"input": xq})["logits"]
    assert yq.dtype == np.int8 and yq.shape == (1, 10)
    y = (yq.astype(np.float32) - zo) * so
    assert np.abs(y - fp32_out).max() < 0.1 * np.abs(fp32_out).max()
    if fmt == "qoperator":  # the whole example is integer: not one Q/DQ left
        assert not ops(q)["QuantizeLinear"] and not ops(q)["DequantizeLinear"]


def test_hybrid_picks_qoperator_for_conv_relu_maxpool():
    q = quantize(conv_relu_pool_model(), quant_format="HyBrid")
    assert ops(q)["QLinearConv"] == 2 and ops(q)["Conv"] == 0


@pytest.mark.parametrize("build", [conv_reducemean_model, build_example_cnn])  # ReduceMean / Gemm
def test_hybrid_picks_qdq_otherwise(build):
    q = quantize(build(), quant_format="hybrid")
    c = ops(q)
    assert c["Conv"] >= 1 and c["QuantizeLinear"] and c["DequantizeLinear"]
    assert not any(o.startswith("QLinear") or o == "QGemm" for o in c)


def test_hybrid_falls_back_to_qdq_when_qoperator_quantizes_nothing():
    m = model([helper.make_node("Relu", ["x"], ["r"]),
               helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", [1, 4, 8, 8])], [vi("y", [1, 4, 4, 4])])
    q = quantize(m, quant_format="hybrid")
    assert ops(q)["QuantizeLinear"] >= 1
    with pytest.raises(TorqError, match="quantized nothing"):
        quantize(m, quant_format="qoperator")


def test_synthetic_reader_is_deterministic_and_resets(cnn):
    r1, r2 = SyntheticDataReader(cnn, 3), SyntheticDataReader(cnn, 3)
    first = [r1.get_next()["input"] for _ in range(3)]
    assert r1.get_next() is None
    for a in first:
        np.testing.assert_array_equal(a, r2.get_next()["input"])
        assert a.dtype == np.float32 and a.shape == (1, 3, 32, 32)
        assert a.min() >= -1 and a.max() < 1
    r1.reset()
    np.testing.assert_array_equal(r1.get_next()["input"], first[0])
    assert not np.array_equal(first[0], first[1])
    # the whole quantization is reproducible
    assert quantize(cnn).SerializeToString() == quantize(cnn).SerializeToString()


def test_synthetic_reader_open_batch_is_one_other_open_dims_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 3, 5, 4])], [vi("y", ["N", 3, 5, 4])])
    assert SyntheticDataReader(m, 1).get_next()["x"].shape == (1, 3, 5, 4)
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 3, "H", 4])], [vi("y", ["N", 3, "H", 4])])
    with pytest.raises(TorqError, match=r"'x' has no size at axis 2 .*--input-shape x=1,3,D2,4"):
        SyntheticDataReader(m, 1)


class TimesTen(CalibrationDataReader):
    def __init__(self, n=5):
        self.inner = SyntheticDataReader(build_example_cnn(), n)

    def get_next(self):
        s = self.inner.get_next()
        return None if s is None else {k: v * 10 for k, v in s.items()}


def test_custom_reader_is_used(cnn):
    base = input_scale(quantize(cnn, num_calib=5))
    scaled = input_scale(quantize(cnn, calibration_data_reader=TimesTen(5)))
    assert scaled == pytest.approx(base * 10, rel=1e-5)


def _calib(n=6, batch_axis=False):
    x = np.random.default_rng(3).uniform(-2, 2, (n, 1, 3, 32, 32) if batch_axis else (n, 3, 32, 32))
    return x.astype(np.float32)


@pytest.mark.parametrize("batch_axis", [False, True])
def test_npz_dataset(cnn, tmp_path, batch_axis):
    np.savez(tmp_path / "calib.npz", input=_calib(batch_axis=batch_axis), label=np.arange(6))
    q = quantize(cnn, calibration_data=tmp_path / "calib.npz")
    assert input_scale(q) == pytest.approx(2.0 * 2 / 255, rel=0.05)  # range ~[-2, 2]
    assert input_scale(q) != pytest.approx(input_scale(quantize(cnn)), rel=0.05)


def test_npy_folder_dataset_matches_npz(cnn, tmp_path):
    data = _calib()
    np.savez(tmp_path / "calib.npz", input=data)
    (tmp_path / "folder").mkdir()
    np.save(tmp_path / "folder" / "input.npy", data)
    a = quantize(cnn, calibration_data=tmp_path / "calib.npz")
    b = quantize(cnn, calibration_data=tmp_path / "folder")
    assert a.graph.SerializeToString() == b.graph.SerializeToString()   # metadata names the data


def test_num_calib_caps_dataset(cnn, tmp_path):
    data = _calib()
    data[3:] *= 10  # only visible if more than 3 samples are used
    np.savez(tmp_path / "c.npz", input=data)
    assert input_scale(quantize(cnn, calibration_data=tmp_path / "c.npz", num_calib=3)) < \
        input_scale(quantize(cnn, calibration_data=tmp_path / "c.npz"))


@pytest.mark.parametrize("case, expect", [
    ("missing_key", "no array for model input(s) 'input'"),
    ("wrong_shape", "has shape (4, 3, 16, 16), expected (N, 1, 3, 32, 32)"),
    ("not_npz", "cannot read calibration data as .npz"),
    ("npy_file", "must be an .npz archive"),
    ("folder_missing", "lacks input.npy"),
    ("nothing", "calibration data not found"),
    ("count_mismatch", "different sample counts"),
])
def test_bad_datasets(cnn, tmp_path, case, expect):
    p = tmp_path / "calib.npz"
    m = cnn
    if case == "missing_key":
        np.savez(p, images=_calib())
    elif case == "wrong_shape":
        np.savez(p, input=np.zeros((4, 3, 16, 16), np.float32))
    elif case == "not_npz":
        p.write_bytes(b"definitely not a zip archive")
    elif case == "npy_file":
        p = tmp_path / "calib.npy"
        np.save(p, _calib())
    elif case == "folder_missing":
        p = tmp_path / "dir"
        p.mkdir()
        np.save(p / "other.npy", _calib())
    elif case == "nothing":
        p = tmp_path / "nope.npz"
    elif case == "count_mismatch":
        m = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", [1, 4]), vi("b", [1, 4])],
                  [vi("y", [1, 4])])
        np.savez(p, a=np.zeros((3, 4), np.float32), b=np.zeros((5, 4), np.float32))
    with pytest.raises(TorqError) as e:
        quantize(m, calibration_data=p)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_dynamic_batch_model_quantizes_and_keeps_dynamic_batch():
    m = build_example_cnn()
    for v in (m.graph.input[0], m.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    q = quantize(m, full_integer=True)
    assert q.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = np.random.default_rng(0).integers(-128, 128, (3, 3, 32, 32)).astype(np.int8)
    assert run(q, {"input": x})["logits"].shape == (3, 10)


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
def test_zero_range_activation_quantizes(method):
    q = quantize(zero_branch_model(), calibrate_method=method, num_calib=4)
    for name, s in scales(q).items():
        assert np.isfinite(s).all() and (s > 0).all(), name
    out = run(q, {"x": rand_input((1, 3, 8, 8))})
    np.testing.assert_array_equal(out["z"], 0)


def test_constant_input_quantizes():
    class Const(CalibrationDataReader):
        def __init__(self):
            self.n = 0

        def get_next(self):
            self.n += 1
            return {"x": np.full((1, 3, 8, 8), 0.5, np.float32)} if self.n <= 3 else None
    q = quantize(conv_relu_pool_model(), calibration_data_reader=Const())
    assert all(np.isfinite(s).all() and (s > 0).all() for s in scales(q).values())
    run(q, {"x": rand_input((1, 3, 8, 8))})


def test_nan_weights_rejected():
    w = numpy_helper.to_array(weight("w1", (4, 3, 3, 3))).copy()
    w[0, 0, 0, 0] = np.nan
    m = conv_reducemean_model()
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w1"))
    with pytest.raises(TorqError, match="initializer 'w1' contains NaN"):
        quantize(m)


def test_already_quantized_rejected(cnn):
    with pytest.raises(TorqError, match="already quantized"):
        quantize(quantize(cnn))


@pytest.mark.parametrize("kw, expect", [
    ({"quant_dtype": "A16W16"}, "--quant-dtype 'A16W16': supported values are A8W8, A16W8"),
    ({"quant_dtype": "A16W8", "quant_format": "qoperator"}, "A16W8, --precision int16 / auto) need --quant-format qdq"),
    ({"quant_format": "qqq"}, "--quant-format 'qqq': supported values are qdq, qoperator, hybrid"),
    ({"calibrate_method": "kl"}, "--calibrate-method 'kl': supported values are minmax, entropy, percentile"),
    ({"num_calib": 0}, "--num-calib must be a positive integer"),
])
def test_bad_options(cnn, tmp_path, kw, expect):
    out = tmp_path / "out.onnx"
    with pytest.raises(TorqError) as e:
        quantize(cnn, out, **kw)
    assert expect in str(e.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_case_insensitive_options_and_output_file(cnn, tmp_path):
    out = tmp_path / "sub" / "q.onnx"
    q = quantize(cnn, out, quant_format="QDQ", quant_dtype="a8w8", calibrate_method="MinMax")
    assert onnx.load(out) == q
    assert [p.name for p in out.parent.iterdir()] == ["q.onnx"]  # no temp files left


def test_input_model_not_modified(cnn, tmp_path):
    before = cnn.SerializeToString()
    quantize(cnn)
    assert cnn.SerializeToString() == before


def test_a16w8_quantizes_activations_to_int16_and_runs_on_the_nss(cnn):
    """--quant-dtype A16W8: int16 activations (QDQ), int8 weights; every op lowers to the NSS,
    which verify holds to the int16 contract (docs/a16w8.md)."""
    from torq import compile
    from torq.verify import verify
    q = quantize(cnn, quant_dtype="a16w8", per_channel=True, full_integer=True)
    zps = {n.input[2] for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    types = Counter(t.data_type for t in q.graph.initializer if t.name in zps)
    assert types[onnx.TensorProto.INT16] > 0 and types[onnx.TensorProto.INT8] > 0     # weights stay int8
    assert q.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT16
    c = compile(q)
    assert c.report.unsupported == [], [str(u) for u in c.report.unsupported]
    r = verify(c)
    assert r.ok and r.float_steps >= 5
