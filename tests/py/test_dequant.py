"""Every tensor type: our dequantization matches the PyPI gguf package bit for
bit, and our quantizers agree with it where it has one.

The GGUF file is written by gguf.GGUFWriter and read back by gguf.GGUFReader,
so none of our code takes part in making or parsing the expected values:
`resident-model dequant FILE OUTDIR` writes tensor i as OUTDIR/<i>.f32, and
each must equal gguf.quants.dequantize of the same tensor as float32 bits
(compared as uint32, so NaN payloads count and a NaN equals itself).
"""
import os
import subprocess
import sys
import tempfile

from common import Checks, binary, skip

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES
except ImportError as e:
    skip(f"needs the numpy and gguf Python packages ({e})")

ROWS = 4
BLOCKS_PER_ROW = 8

# Byte offsets of the f16 scale fields in each block type (ggml-common.h).
# Random bytes there could be inf or NaN, which would make every value of the
# block NaN and the comparison say little, so they get finite halves.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
# Q8_K's d is a float32 at offset 0. Q8_1 is left out: gguf-py's size table
# has its old 40-byte layout, not ggml's 36-byte one, and no file holds it.
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K,
               T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K, T.MXFP4]
# Types gguf-py quantizes itself: tensors made from real values too.
PY_QUANTIZABLE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
# Round-trip error bounds (RMS error / RMS of the data) for the quantizers
# gguf-py lacks; tests/unit/test_quant.c has the measured values.
ERROR_BOUND = {T.Q4_K: 0.082, T.Q5_K: 0.041, T.Q6_K: 0.021}

rng = np.random.default_rng(20240917)
check = Checks()


def finite_f16(n):
    """n random finite halves (normals, subnormals, zeros of both signs)."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    h[(h & 0x7c00) == 0x7c00] &= 0xbfff
    return h


def random_blocks(qtype):
    """ROWS rows of random blocks with finite scale fields, as uint8."""
    n = ROWS * BLOCKS_PER_ROW
    size = GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (n, size), dtype=np.uint32).astype(np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        raw[:, off:off + 2] = finite_f16(n).view(np.uint8).reshape(n, 2)
    if qtype == T.Q8_K:
        d = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
        raw[:, 0:4] = d.astype(np.float32).view(np.uint8).reshape(n, 4)
    return raw.reshape(ROWS, -1)


def float_tensors():
    """F32, F16 and BF16 tensors of wholly random bits: inf, NaN (signalling
    ones too) and subnormals included, since the widening must be exact."""
    n = BLOCKS_PER_ROW * 32
    bits32 = rng.integers(0, 1 << 32, (ROWS, n), dtype=np.uint64).astype(np.uint32)
    bits16 = rng.integers(0, 1 << 16, (ROWS, n), dtype=np.uint32).astype(np.uint16)
    bf16 = rng.integers(0, 1 << 16, (ROWS, n), dtype=np.uint32).astype(np.uint16)
    return [("f32.random", bits32.view(np.float32), None),
            ("f16.random", bits16.view(np.float16), None),
            ("bf16.random", bf16.view(np.uint8), T.BF16)]


def weights(n_rows, n_cols):
    """Weight-like values: a scale per row, a few outliers."""
    x = rng.standard_normal((n_rows, n_cols)) * np.exp2(rng.integers(-8, 2, (n_rows, 1)))
    x[rng.random((n_rows, n_cols)) < 0.01] *= 20
    return x.astype(np.float32)


def build_gguf(path):
    """Writes the test file; returns [(name, type)] in file order."""
    w = gguf.GGUFWriter(path, "resident-test")
    tensors = float_tensors()
    for qtype in BLOCK_TYPES:
        tensors.append((f"{qtype.name.lower()}.random", random_blocks(qtype), qtype))
    for qtype in PY_QUANTIZABLE:
        q = quants.quantize(weights(ROWS, BLOCKS_PER_ROW * 32), qtype)
        raw = None if qtype == T.F16 else qtype
        tensors.append((f"{qtype.name.lower()}.quantized", q, raw))
    for name, data, raw_dtype in tensors:
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [name for name, _, _ in tensors]


def expected(t):
    """gguf-py's float32 values of a tensor read back by GGUFReader. gguf-py
    has no Q8_K dequantizer; that type is d (float32) times the int8 quants,
    done here in numpy, which rounds the product once as C does."""
    if t.tensor_type == T.Q8_K:
        blocks = np.asarray(t.data).reshape(-1, GGML_QUANT_SIZES[T.Q8_K][1])
        d = blocks[:, 0:4].copy().view(np.float32)
        return d * blocks[:, 4:260].view(np.int8).astype(np.float32)
    return quants.dequantize(np.asarray(t.data), t.tensor_type)


def check_dequant(tool, tmp):
    """Every tensor of a GGUF: resident-model dequant against gguf-py."""
    path = os.path.join(tmp, "types.gguf")
    names = build_gguf(path)
    outdir = os.path.join(tmp, "dequant")
    os.mkdir(outdir)
    r = subprocess.run([tool, "dequant", path, outdir], capture_output=True, text=True)
    check(r.returncode == 0, f"resident-model dequant exits 0 {r.stderr.strip()}")
    reader = gguf.GGUFReader(path)
    check([t.name for t in reader.tensors] == names, "tensors read back in file order")
    for i, t in enumerate(reader.tensors):
        want = np.ascontiguousarray(expected(t), dtype=np.float32).reshape(-1).view(np.uint32)
        out = os.path.join(outdir, f"{i}.f32")
        got = np.fromfile(out, dtype="<u4") if os.path.exists(out) else np.zeros(0, np.uint32)
        same = got.size == want.size and np.array_equal(got, want)
        detail = ""
        if not same and got.size == want.size:
            bad = np.nonzero(got != want)[0]
            detail = f": {bad.size} differ, first at {bad[0]}: {got[bad[0]]:#010x} != {want[bad[0]]:#010x}"
        elif not same:
            detail = f": {got.size} values, expected {want.size}"
        check(same, f"dequant {t.name} ({t.tensor_type.name}, {want.size} values) "
              f"bit-identical to gguf.quants.dequantize{detail}")


def run_quantize(tool, tmp, qtype, x):
    """Our quantizer on x (float32), as bytes, or None if it failed."""
    src, dst = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.bin")
    x.astype("<f4").tofile(src)
    r = subprocess.run([tool, "quantize", qtype.name, src, dst], capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"resident-model quantize {qtype.name}: {r.stderr.strip()}")
        return None
    return np.fromfile(dst, dtype=np.uint8)


def check_quantize(tool, tmp):
    """resident-model quantize against gguf-py's quantizers, where it has
    them (its Q8_0 is documented bit-exact with ggml's C reference).

    gguf-py has no Q4_K/Q5_K/Q6_K quantizer, so for those our bytes are
    decoded by gguf-py's dequantizer and must land within the error bound of
    the format; that they are llama.cpp's own bytes is checked in
    tests/unit/test_quant.c against hashes of its reference quantizer."""
    # Normal values with a scale per row (the bounds are for normal data),
    # and an all-zero block, which takes its own path.
    x = (rng.standard_normal((16, 4 * 256)) * np.exp2(rng.integers(-8, 2, (16, 1)))).astype(np.float32)
    x[3, :256] = 0
    for qtype in [T.F16, T.BF16, T.Q5_0, T.Q8_0, T.MXFP4]:
        ours = run_quantize(tool, tmp, qtype, x)
        if ours is not None:
            theirs = np.asarray(quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
            check(np.array_equal(ours, theirs),
                  f"quantize {qtype.name} ({x.size} values): bytes equal gguf.quants.quantize")
    for qtype, bound in ERROR_BOUND.items():
        ours = run_quantize(tool, tmp, qtype, x)
        if ours is None:
            continue
        try:
            theirs = np.asarray(quants.quantize(x, qtype)).view(np.uint8).reshape(-1)
            check(np.array_equal(ours, theirs),
                  f"quantize {qtype.name}: bytes equal gguf.quants.quantize")
            continue
        except NotImplementedError:
            pass
        if ours.size != x.size // 256 * GGML_QUANT_SIZES[qtype][1]:
            check(False, f"quantize {qtype.name}: {ours.size} bytes")
            continue
        y = quants.dequantize(ours.reshape(16, -1), qtype).reshape(x.shape)
        err = float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2)))
        zero = bool(np.all(y[3, :256] == 0))
        check(err <= bound and zero,
              f"quantize {qtype.name} ({x.size} values): gguf-py decodes it with relative "
              f"RMS error {err:.4f} (bound {bound}), zero block {'kept' if zero else 'LOST'}")


def main():
    tool = binary("resident-model")
    with tempfile.TemporaryDirectory(prefix="resident-dequant-") as tmp:
        check_dequant(tool, tmp)
        check_quantize(tool, tmp)
    print(f"{check.n - len(check.failed)} passed, {len(check.failed)} failed")
    check.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
