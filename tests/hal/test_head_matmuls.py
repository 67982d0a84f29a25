"""The grouped per-head matmuls (kernels/grouped.cpp, MLA's W_UK / W_UV): each product has the
bits of its own matmul_f32 call, at decode and prefill row counts, on every ISA this CPU runs
(each ISA in a fresh process: the first kernel call fixes it), and bad input is refused
naming the value."""

from __future__ import annotations

import json

import pytest
import torch

from agentkv.hal.base import BackendUnavailable
from agentkv.hal.kernels import load
from tests.hal.subproc import run_python

try:
    K = load()
except BackendUnavailable as e:
    pytest.skip(f"the cpu backend cannot run here: {e}", allow_module_level=True)

ISAS = ["avx2"] + (["avx512"] if K.isa_supported("avx512") else [])

CHECK = """
import json, torch
from agentkv.hal.kernels import load
K = load()
K.set_isa(ISA)
g = torch.Generator().manual_seed(0)
out = {}
for m in (1, 3, 9, 48, 60):  # 60: past the decode rows, one matmul call per head
    for n, k in ((512, 128), (128, 512)):
        xs = [torch.randn(m, k, generator=g) for _ in range(16)]
        ws = [torch.randn(n, k, generator=g) for _ in range(16)]
        got = K.head_matmuls(xs, ws)
        want = [K.matmul_f32(x, w) for x, w in zip(xs, ws)]
        out[f"{m}x{k}->{n}"] = all(torch.equal(a, b) for a, b in zip(got, want))
# the control: the same products through torch's own matmul differ in some bit
xs, ws = [torch.randn(3, 128, generator=g) for _ in range(16)], [torch.randn(512, 128, generator=g) for _ in range(16)]
out["control_torch_differs"] = not all(torch.equal(a, x @ w.T) for a, x, w in zip(K.head_matmuls(xs, ws), xs, ws))
out["isa"] = K.isa()
print(json.dumps(out))
"""


def run_check(isa: str, script: str) -> dict:
    """`script` in a fresh process on `isa`: its JSON line, checked to have run there."""
    out = json.loads(run_python(f"ISA = {isa!r}\n" + script).stdout.strip().splitlines()[-1])
    assert out.pop("isa") == isa
    return out


@pytest.mark.parametrize("isa", ISAS)
def test_every_head_has_the_bits_of_its_own_matmul(isa):
    out = run_check(isa, CHECK)
    assert out.pop("control_torch_differs") is True
    assert all(out.values()), out


def test_bad_input_is_refused_naming_the_value():
    x, w = torch.zeros(2, 128), torch.zeros(64, 128)
    with pytest.raises(RuntimeError, match="2 inputs for 1 weights"):
        K.head_matmuls([x, x], [w])
    with pytest.raises(RuntimeError, match="k=100 must be a multiple of 32"):
        K.head_matmuls([torch.zeros(2, 100)], [torch.zeros(64, 100)])
    with pytest.raises(RuntimeError, match=r"xs\[1\] \[2, 64\] and ws\[1\] \[64, 128\] must be"):
        K.head_matmuls([x, torch.zeros(2, 64)], [w, w])
    with pytest.raises(RuntimeError, match=r"ws\[0\] must be a contiguous 2-D CPU float32 tensor, got Double"):
        K.head_matmuls([x], [w.double()])


# qmatmuls: projections of one input with mixed qtypes (a hybrid's DeltaNet inputs: Q4_K, Q6_K,
# f32 rows; odd row counts so chunks straddle weights), each with its own qmatmul call's bits,
# f32 and (where VNNI is) int8 activations, decode and prefill row counts.
QMATMULS = """
import json, torch
from agentkv.hal.kernels import load
from tests.hal.test_kernels import QTYPES, random_quant
K = load()
K.set_isa(ISA)
g = torch.Generator().manual_seed(1)
k = 512
parts = [("Q4_K", 70), ("Q6_K", 33), ("F32", 16), ("Q8_0", 45), ("Q4_K", 5)]
ws, qtypes, ns = [], [], []
for i, (name, n) in enumerate(parts):
    if name == "F32":
        ws.append(torch.randn(n, k, generator=g)); qtypes.append(0)
    else:
        ws.append(torch.from_numpy(random_quant(name, n, k, seed=i))); qtypes.append(QTYPES[name])
    ns.append(n)
modes = [False, True]
out = {}
for int8 in modes:
    for m in (1, 2, 7, 48, 49):
        x = torch.randn(m, k, generator=g)
        got = K.qmatmuls(x, ws, qtypes, ns, int8)
        want = [K.matmul_f32(x, w) if q == 0 else K.qmatmul(x, w, q, n, k, int8) for w, q, n in zip(ws, qtypes, ns)]
        out[f"{m} int8={int8}"] = all(torch.equal(a, b) for a, b in zip(got, want))
# the control: a changed input row changes that row of every output, and only that row
x = torch.randn(3, k, generator=g)
y = x.clone(); y[1, :64] += 1.0
a, b = K.qmatmuls(x, ws, qtypes, ns, False), K.qmatmuls(y, ws, qtypes, ns, False)
out["control_row_changes"] = all(
    not torch.equal(p[1], q[1]) and torch.equal(p[0], q[0]) and torch.equal(p[2], q[2]) for p, q in zip(a, b)
)
out["isa"] = K.isa()
print(json.dumps(out))
"""


@pytest.mark.parametrize("isa", ISAS)
def test_qmatmuls_outputs_have_the_bits_of_their_own_calls(isa):
    out = run_check(isa, QMATMULS)
    assert out.pop("control_row_changes") is True
    assert all(out.values()), out


def test_qmatmuls_refuses_bad_input_naming_the_value():
    x = torch.zeros(2, 256)
    with pytest.raises(RuntimeError, match="2 weights, 1 qtypes"):
        K.qmatmuls(x, [torch.zeros(4, 256), torch.zeros(4, 256)], [0], [4, 4])
    with pytest.raises(RuntimeError, match=r"ws\[0\] rows of 1024 bytes do not hold k=256 weights of qtype 12"):
        K.qmatmuls(x, [torch.zeros(4, 256)], [12], [4])
    with pytest.raises(RuntimeError, match="unsupported qtype 99"):
        K.qmatmuls(x, [torch.zeros(4, 256)], [99], [4])
