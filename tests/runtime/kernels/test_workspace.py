"""Accumulators built in a reused Workspace (buffers handed from one conv to the next, any
shapes and dtypes) are exact against plain int64 formulas, batch invariant; the workspace reuses
its memory."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmodels import depthwise_ref
from torq.runtime.kernels import ConvPlan, Workspace

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def conv_chain(draw):
    """Several convolutions (dense 1x1 / kxk with stride, depthwise) run one after another
    through one workspace: each takes buffers the previous one left."""
    convs = []
    for _ in range(draw(st.integers(2, 4))):
        C = draw(st.integers(1, 12))
        k = draw(st.sampled_from([1, 3, 5]))
        convs.append(dict(C=C, O=C if draw(st.booleans()) else draw(st.integers(1, 12)), k=k,
                          s=draw(st.integers(1, 2)), HW=draw(st.integers(k, 20)),
                          N=draw(st.integers(1, 3)), x16=draw(st.booleans())))
    return convs, draw(st.integers(0, 2**32 - 1))


def _conv_ref(x, w, pv, k, s):
    p = k // 2
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (p, p), (p, p)), constant_values=pv)
    N, C, H, W = xp.shape
    OH, OW = (H - k) // s + 1, (W - k) // s + 1
    out = np.zeros((N, w.shape[0], OH, OW), np.int64)
    for i in range(k):
        for j in range(k):
            win = xp[:, :, i:i + (OH - 1) * s + 1:s, j:j + (OW - 1) * s + 1:s]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, i, j].astype(np.int64))
    return out


@settings(max_examples=40, **SETTINGS)
@given(case=conv_chain())
def test_accumulators_in_a_shared_workspace_are_exact(case):
    convs, seed = case
    rng = np.random.default_rng(seed)
    ws = Workspace()
    for c in convs:
        depth = c["O"] == c["C"] and rng.random() < 0.5
        lo, hi = (-(1 << 15), (1 << 15) - 1) if c["x16"] else (-128, 127)
        x = rng.integers(lo, hi, (c["N"], c["C"], c["HW"], c["HW"]), endpoint=True).astype(
            np.int16 if c["x16"] else np.int8)
        w = rng.integers(-127, 128, (c["O"], 1 if depth else c["C"], c["k"], c["k"]))
        pv = int(rng.integers(lo, hi, endpoint=True))
        p = c["k"] // 2
        plan = ConvPlan(w, None, (p, p, p, p), pv, c["s"], 1, c["C"] if depth else 1)
        ref = depthwise_ref(x, w, (p, p, p, p), pv, (c["s"],) * 2, (1, 1)) if depth else \
            _conv_ref(x, w, pv, c["k"], c["s"])
        parts = plan.parts(x, ws)
        assert np.array_equal(parts.int64(), ref)
        assert np.array_equal(plan.parts(x[:1], ws).int64(), ref[:1])   # batch invariant


def test_workspace_reuses_its_memory():
    ws = Workspace()
    a = ws.array("acc", (4, 8, 10), np.float32)
    b = ws.array("acc", (2, 3), np.float64)
    assert np.shares_memory(a, b) and b.shape == (2, 3) and b.dtype == np.float64
    c = ws.array("other", (5,), np.int64)
    assert not np.shares_memory(a, c)
    big = ws.array("acc", (1000, 1000), np.float32)               # grows when it must
    assert big.shape == (1000, 1000) and ws.nbytes >= big.nbytes
