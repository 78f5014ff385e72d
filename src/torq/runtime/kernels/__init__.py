"""Exact integer accumulation kernels for the NSS simulator (NCHW; numpy + BLAS, and a few
numba-compiled loops where numpy would need a chain of temporaries).

These are the simulator's hot path. Every function returns the *exact* integer result; no
rounding decision is made here (that is ``torq.numerics``' job). One module per algorithm:
``gemm`` (exact GEMM, fully connected), ``conv`` (convolutions), ``depthwise``, ``winograd``,
``pool``, ``tables`` (byte-pair lookup).

How exactness is kept while still using BLAS
--------------------------------------------
numpy's integer matmul does not use BLAS and is ~30x slower than float GEMM, so the GEMMs run
in floating point and are made exact by bounding magnitudes:

* The input may be *centred*: ``x' = x - c`` (c the midpoint of the values present, including
  the pad value) when that lowers ``max|x'|`` enough to matter (uint8 / int16 activations;
  int8 activations are used as they are). The shift is undone exactly with the integer term
  ``c * Σ_k w[o, k]`` (every kernel tap reads a real or padded input, so the correction is the
  same for every output position).
* float32: K is split into contiguous chunks such that, for every output channel o,
  ``mx * Σ_{k in chunk} |w[o, k]| <= 2**24 - 1`` (mx bounds |x'|). Every partial sum of a
  chunk's products (in any order, any blocking, with or without FMA) is a sum over a subset
  of the chunk's products, so it is an integer of magnitude < 2**24 and float32 holds it
  exactly. Chunk results are added in float64 (exact below 2**53). Using Σ|w| instead of
  K * max|w| makes chunks longer (usually one chunk per layer).
* When float32 chunks would be short (< 64 on average, e.g. int16 weights) the GEMM runs in
  float64 (exact while mx * Σ|w| < 2**53); beyond that, int64 matmul.

Convolutions (``ConvPlan``): the weights are reordered once to [g, O/g, KH*KW*Cg] (K in
(kh, kw, c) order) and split into chunks; per run, the padded input is converted once to the
GEMM dtype as "phase" images (one per (row, col) residue of the stride, so every tap is a
unit-stride window of a phase), and the column buffer [K, L] is filled with one block copy per
tap. For taps of unit stride the copy is a contiguous slice of the *flattened* phase ("wide"
columns: the GEMM then also computes ``Wq - OW`` junk columns per output row, which are never
read). 1x1 convolutions with one phase need no column buffer at all. The GEMM output [O, L] is
already NCHW. 3x3 / stride 1 / single-group convolutions with enough output (>= 32 2x2 tiles)
use an exact integer Winograd F(2x2, 3x3) instead (16 instead of 36 multiplies per 2x2 output
tile, see ``_Winograd``; its input and output transforms are compiled loops, the 16 GEMMs
BLAS); if its bounds do not hold (wide inputs / weights) the GEMM path runs.

Compiled loops stay single-threaded on purpose: BLAS already uses every core for the GEMMs,
and its worker threads spin for a while after each call, so a second thread pool fights them
(measured: a 2-thread numba Winograd transform made ResNet-18 7x slower on 2 vCPUs). For the
same reason small GEMMs run on one BLAS thread (``blas.gemm_threads``, switched once per
simulator run by ``blas.single_thread_run``; not the batched Winograd GEMMs, which gain from
every core). Several cores are used one level up: independent calls (the sub-batches of a batch)
run side by side in threads (``Simulator.run_many``, ``evaluate``'s default: ~1.8x on 2 cores),
or batches in several processes (``evaluate --jobs``). Each thread's accumulators live in its own
``workspace.Workspace`` (reused from step to step: no fresh pages per step).

Depthwise convolutions (``depthwise``) are compiled loops reading the integer input directly:
per plane (wide planes: the stride phases, then one contiguous run per tap) or channels-last
(7x7 / 14x14 planes: vectorised along the channels, a kernel row of 3 or 5 taps summed per pass),
in float32 when KH*KW*max|x'|*max|w| < 2**24 (every partial sum exact, in any order), else
float64/int64.

Layout: activations [N, C, H, W]; conv weights [O, C/groups, KH, KW]; fc weights [O, K].
``pad_lrtb`` is (left, right, top, bottom) as in ``torq_hl`` ops (ONNX ``pads`` is
[top, left, bottom, right]). Pooling assumes ceil_mode = 0.
"""
from __future__ import annotations

from .byteplanes import ByteConv, ByteFc
from .conv import ConvPlan, conv2d_acc
from .gemm import AccParts, FcPlan, conv_out_size, fc_acc
from .pool import maxpool, pool_sum
from . import depthwise
from .tables import BYTE_TYPES, byte_grid, pair_lookup
from .workspace import Workspace, thread_workspace

__all__ = ["ByteConv", "ByteFc", "conv_out_size", "conv2d_acc", "fc_acc", "pool_sum", "maxpool", "ConvPlan", "FcPlan",
           "AccParts", "BYTE_TYPES", "byte_grid", "pair_lookup", "Workspace", "thread_workspace"]
