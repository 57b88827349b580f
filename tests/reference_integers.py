"""Slow, obviously-correct references for integer weight quantisation and its storage layouts.

Nothing here shares code with the package, and nothing imports torch: numpy and ml_dtypes only.
Words are built as Python integers (``|`` and ``<<`` on unbounded ints) and only then stored as
int32 (the same 32 bits, read as two's complement), so no shift can overflow or sign-extend.

Public names:

- ``ct_quantize_ref(w, bits, group_size, symmetric, scale_dtype)`` -> ``(q, scale, zero_point)``:
  compressed-tensors' integer weight rule (``calculate_qparams`` then ``quantize``).
- ``ct_dequantize_ref(q, scale, zero_point, group_size, g_idx=None)``: ``(q - zp) * scale``.
- ``ct_pack_dense`` / ``ct_unpack_dense``: ``pack-quantized`` words (a dense bit stream per row).
- ``ct_pack_padded`` / ``ct_unpack_padded``: the older ``pack-quantized`` words (32 // b per word).
- ``ct_pack_zero_points`` / ``ct_unpack_zero_points``: zero points, dense along dim 0.
- ``AWQ_ORDER``, ``awq_pack``, ``awq_unpack``, ``awq_dequantize``: AutoAWQ's GEMM layout.
- ``gptq_default_g_idx``, ``gptq_pack``, ``gptq_unpack``, ``gptq_dequantize``: AutoGPTQ/GPTQModel.
- ``q4_0_blocks``, ``q8_0_blocks``, ``dequant_q4_0``, ``dequant_q8_0``: ggml's block_q4_0/q8_0.

"Rounded to dt" means: the operation is done in float32 (IEEE, round to nearest even) and the
result is rounded to nearest even in dt. This is what torch does on CPU for bfloat16 and float16,
and for +, -, * and / it equals one correct rounding in dt (float32 carries more than twice the
significand bits of either). For float32 weights it is plain float32 arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np

FLOAT_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
# torch.finfo(dt).eps: compressed-tensors' replacement for a zero scale.
EPS: dict[str, float] = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
AWQ_ORDER: tuple[int, ...] = (0, 2, 4, 6, 1, 3, 5, 7)
QK: int = 32  # values per ggml Q4_0 / Q8_0 block


def _dtype_name(dtype: object) -> str:
    """The name ("float32", "float16" or "bfloat16") of a float dtype given as a name or a dtype."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in FLOAT_DTYPES:
        raise ValueError(f"unsupported float dtype {dtype!r}")
    return name


def _rnd(x: object, dt: np.dtype) -> np.ndarray:
    """Round float32 value(s) to dt (nearest even) and widen back to float32 (exact)."""
    return np.asarray(x, dtype=np.float32).astype(dt).astype(np.float32)


def _check_codes(q: np.ndarray, lo: int, hi: int, what: str) -> np.ndarray:
    """``q`` as int64 after checking it is an integer array with every value in [lo, hi]."""
    q = np.asarray(q)
    if q.dtype.kind not in "iu":
        raise TypeError(f"{what} must be an integer array, got {q.dtype}")
    q = q.astype(np.int64)
    if q.size and (q.min() < lo or q.max() > hi):
        raise ValueError(f"{what} out of range [{lo}, {hi}]")
    return q


def _to_int32(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Rows of unsigned 32-bit Python ints -> int32 array with the same bits."""
    return np.array(words, dtype=np.uint32).reshape(len(words), -1).view(np.int32)


def _stream_pack(values: Sequence[int], bits: int) -> list[int]:
    """Dense little-endian bit stream: value i occupies bits [i*bits, i*bits + bits); 32-bit words."""
    stream = 0
    for i, v in enumerate(values):
        stream |= int(v) << (i * bits)
    n_words = math.ceil(len(values) * bits / 32)
    return [(stream >> (32 * k)) & 0xFFFFFFFF for k in range(n_words)]


def _stream_unpack(words: Sequence[int], bits: int, count: int) -> list[int]:
    """Inverse of ``_stream_pack``: the first ``count`` unsigned values of the stream."""
    stream = 0
    for k, word in enumerate(words):
        stream |= (int(word) & 0xFFFFFFFF) << (32 * k)
    mask = (1 << bits) - 1
    return [(stream >> (i * bits)) & mask for i in range(count)]


def _words(packed: np.ndarray) -> np.ndarray:
    """int32 words as unsigned 32-bit values (int64 array)."""
    packed = np.asarray(packed)
    if packed.dtype != np.int32:
        raise TypeError(f"packed words must be int32, got {packed.dtype}")
    return packed.view(np.uint32).astype(np.int64)


# --- compressed-tensors: quantisation rule ---
def ct_quantize_ref(
    w: np.ndarray, bits: int, group_size: int | None, symmetric: bool, scale_dtype: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """compressed-tensors' integer weight quantisation of a 2-D weight [out, in].

    Groups are ``group_size`` consecutive columns (None: the whole row, CT's "channel" strategy).
    Returns ``(q int8 [out, in], scale [out, groups] in dt, zero_point int8 [out, groups] or None)``.
    Every arithmetic step is rounded to dt, the weight's dtype; ``scale_dtype`` must name dt.

    Where compressed-tensors decides what the rule alone does not say, this follows it:

    - ``in`` must be a multiple of ``group_size`` (CT raises ValueError otherwise; so does this).
    - The zero point is computed from the scale *before* a zero scale is replaced by eps, so a
      group whose scale is 0 (all-zero group) has zp = qmin - 0/0 = NaN; CT casts that NaN to
      int8, which gives 0 (torch on x86 CPUs). Here NaN becomes 0 explicitly. Division is IEEE
      otherwise: a nonzero range whose scale underflows to 0 with mn < 0 gives -inf, so zp = qmax.
    - For symmetric schemes CT returns an all-zero int8 zero point; this returns None.
    """
    w = np.asarray(w)
    name = _dtype_name(w.dtype)
    if _dtype_name(scale_dtype) != name:
        raise ValueError(f"scale_dtype {scale_dtype!r} differs from the weight's dtype {name}")
    if w.ndim != 2:
        raise ValueError("w must be 2-D [out, in]")
    if not 1 <= bits <= 8:
        raise ValueError("bits must be in [1, 8]")
    dt = FLOAT_DTYPES[name]
    rows, cols = w.shape
    size = cols if group_size is None else group_size
    if size <= 0 or cols % size:
        raise ValueError(f"columns ({cols}) must be a multiple of group_size ({size})")
    groups = cols // size
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    bit_range = _rnd(qmax - qmin, dt)
    half_range = _rnd(bit_range / np.float32(2), dt)
    wf = w.astype(np.float32)

    scale = np.zeros((rows, groups), dtype=np.float32)
    zero = np.zeros((rows, groups), dtype=np.int8)
    q = np.zeros((rows, cols), dtype=np.int8)
    with np.errstate(all="ignore"):
        for r in range(rows):
            for g in range(groups):
                block = wf[r, g * size : (g + 1) * size]
                mn = min(np.float32(block.min()), np.float32(0))
                mx = max(np.float32(block.max()), np.float32(0))
                if symmetric:
                    amax = max(abs(mn), abs(mx))
                    s = _rnd(amax / half_range, dt)
                    z = 0
                else:
                    s = _rnd(_rnd(mx - mn, dt) / bit_range, dt)
                    zf = _rnd(np.float32(qmin) - _rnd(mn / s, dt), dt)
                    zf = np.clip(zf, qmin, qmax)  # NaN stays NaN, as in torch.clamp
                    z = 0 if np.isnan(zf) else int(np.rint(zf))
                if s == 0:
                    s = np.float32(EPS[name])
                v = _rnd(block / s, dt)
                if not symmetric:
                    v = _rnd(v + np.float32(z), dt)
                v = np.clip(v, qmin, qmax)
                q[r, g * size : (g + 1) * size] = np.rint(v).astype(np.int8)
                scale[r, g] = s
                zero[r, g] = z
    return q, scale.astype(dt), (None if symmetric else zero)


def ct_dequantize_ref(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    group_size: int | None,
    g_idx: np.ndarray | None = None,
) -> np.ndarray:
    """``(q - zp) * scale`` in the scale's dtype dt (each step rounded to dt); returns dt [out, in].

    Column c uses group ``g_idx[c]`` when g_idx is given, else ``c // group_size`` (group 0 for
    every column when group_size is None, i.e. per channel).
    """
    q = np.asarray(q)
    scale = np.asarray(scale)
    dt = FLOAT_DTYPES[_dtype_name(scale.dtype)]
    rows, cols = q.shape
    out = np.zeros((rows, cols), dtype=np.float32)
    for c in range(cols):
        if g_idx is not None:
            g = int(g_idx[c])
        else:
            g = 0 if group_size is None else c // group_size
        for r in range(rows):
            v = _rnd(q[r, c], dt)
            if zero_point is not None:
                v = _rnd(v - _rnd(zero_point[r, g], dt), dt)
            out[r, c] = _rnd(v * scale[r, g].astype(np.float32), dt)
    return out.astype(dt)


# --- compressed-tensors: pack-quantized ---
def ct_pack_dense(q: np.ndarray, bits: int) -> np.ndarray:
    """pack-quantized (CT >= PR #715): each row of signed codes as one dense bit stream of u = q + 2^(b-1).

    Element i of a row occupies bits [i*b, i*b + b) of the row's stream, least significant bit
    first, crossing word boundaries where it must; result int32 [rows, ceil(cols * b / 32)].
    """
    off = 1 << (bits - 1)
    u = _check_codes(q, -off, off - 1, "q") + off
    return _to_int32([_stream_pack(list(row), bits) for row in u])


def ct_unpack_dense(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Inverse of ``ct_pack_dense``: int8 signed codes [rows, cols]."""
    off = 1 << (bits - 1)
    rows = [[v - off for v in _stream_unpack(list(row), bits, cols)] for row in _words(packed)]
    return np.array(rows, dtype=np.int8).reshape(len(rows), cols)


def ct_pack_padded(q: np.ndarray, bits: int) -> np.ndarray:
    """pack-quantized before CT's PR #715: 32 // b values per word, none crossing a word.

    Value j of word k is element k * (32 // b) + j at shift b * j; the top 32 - (32 // b) * b bits
    and the slots past the row's end are zero. Result int32 [rows, ceil(cols / (32 // b))].
    """
    off = 1 << (bits - 1)
    u = _check_codes(q, -off, off - 1, "q") + off
    per = 32 // bits
    rows, cols = u.shape
    n_words = math.ceil(cols / per)
    words = [[0] * n_words for _ in range(rows)]
    for r in range(rows):
        for i in range(cols):
            k, j = divmod(i, per)
            words[r][k] |= int(u[r, i]) << (bits * j)
    return _to_int32(words)


def ct_unpack_padded(packed: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Inverse of ``ct_pack_padded``: int8 signed codes [rows, cols]."""
    off = 1 << (bits - 1)
    per = 32 // bits
    mask = (1 << bits) - 1
    words = _words(packed)
    out = np.zeros((words.shape[0], cols), dtype=np.int8)
    for r in range(words.shape[0]):
        for i in range(cols):
            k, j = divmod(i, per)
            out[r, i] = ((int(words[r, k]) >> (bits * j)) & mask) - off
    return out


def ct_pack_zero_points(zp: np.ndarray, bits: int) -> np.ndarray:
    """Zero points [out, groups] packed densely along dim 0: int32 [ceil(out * b / 32), groups]."""
    return np.ascontiguousarray(ct_pack_dense(np.asarray(zp).T, bits).T)


def ct_unpack_zero_points(packed: np.ndarray, bits: int, out_features: int) -> np.ndarray:
    """Inverse of ``ct_pack_zero_points``: int8 [out_features, groups]."""
    return np.ascontiguousarray(ct_unpack_dense(np.ascontiguousarray(np.asarray(packed).T), bits, out_features).T)


# --- AutoAWQ GEMM ---
def _awq_words(u: np.ndarray) -> np.ndarray:
    """[rows, 8m] nibbles -> int32 [rows, m]: nibble i of word c holds column 8c + AWQ_ORDER[i]."""
    rows, cols = u.shape
    if cols % 8:
        raise ValueError("AWQ needs a multiple of 8 output columns")
    words = [[0] * (cols // 8) for _ in range(rows)]
    for r in range(rows):
        for c in range(cols // 8):
            for i, col in enumerate(AWQ_ORDER):
                words[r][c] |= int(u[r, 8 * c + col]) << (4 * i)
    return _to_int32(words)


def _awq_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of ``_awq_words``: uint8 [rows, 8m]."""
    words = _words(packed)
    rows, m = words.shape
    out = np.zeros((rows, 8 * m), dtype=np.uint8)
    for r in range(rows):
        for c in range(m):
            for i, col in enumerate(AWQ_ORDER):
                out[r, 8 * c + col] = (int(words[r, c]) >> (4 * i)) & 0xF
    return out


def awq_pack(
    q_unsigned: np.ndarray, z_unsigned: np.ndarray, scales: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AutoAWQ GEMM tensors from codes q [in, out] and zeros z [in/G, out] in [0, 15], scales [in/G, out].

    Returns ``(qweight int32 [in, out/8], qzeros int32 [in/G, out/8], scales float16 [in/G, out])``.
    """
    q = _check_codes(q_unsigned, 0, 15, "q")
    z = _check_codes(z_unsigned, 0, 15, "z")
    if z.shape[1] != q.shape[1] or np.shape(scales) != z.shape:
        raise ValueError("z and scales must be [in/G, out]")
    return _awq_words(q), _awq_words(z), np.asarray(scales).astype(np.float16)


def awq_unpack(qweight: np.ndarray, qzeros: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unsigned codes q [in, out] and zeros z [in/G, out] (uint8) of AutoAWQ's GEMM tensors."""
    return _awq_nibbles(qweight), _awq_nibbles(qzeros)


def awq_dequantize(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """``wT[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]`` in float16; returns the weight [out, in]."""
    q, z = awq_unpack(qweight, qzeros)
    s = np.asarray(scales).astype(np.float32)
    rows, cols = q.shape
    wt = np.zeros((rows, cols), dtype=np.float32)
    for k in range(rows):
        g = k // group_size
        for n in range(cols):
            diff = _rnd(int(q[k, n]) - int(z[g, n]), np.dtype(np.float16))
            wt[k, n] = _rnd(diff * s[g, n], np.dtype(np.float16))
    return wt.astype(np.float16).T.copy()


# --- GPTQ (AutoGPTQ / GPTQModel) ---
def _gptq_words(u: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned [rows, cols] along dim 0 -> int32 [ceil(rows * b / 32), cols].

    For b dividing 32 this is AutoGPTQ's loop ``word[r] |= u[r * pf + j] << (b * j)`` (pf = 32 // b).
    Otherwise (b = 3) it is a dense little-endian bit stream down each column: AutoGPTQ's 3-bit
    layout (32 values in 3 words, values 10 and 21 split across words) is exactly that stream.
    """
    rows, cols = u.shape
    n_words = math.ceil(rows * bits / 32)
    if 32 % bits == 0:
        pf = 32 // bits
        words = [[0] * cols for _ in range(n_words)]
        for r in range(n_words):
            for j in range(pf):
                if r * pf + j < rows:
                    for n in range(cols):
                        words[r][n] |= int(u[r * pf + j, n]) << (bits * j)
        return _to_int32(words)
    per_column = [_stream_pack(list(u[:, n]), bits) for n in range(cols)]
    return np.ascontiguousarray(_to_int32(per_column).T)


def _gptq_values(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of ``_gptq_words``: int64 [count, cols] (the stream read handles every b)."""
    cols = [_stream_unpack(list(col), bits, count) for col in _words(packed).T]
    return np.array(cols, dtype=np.int64).reshape(len(cols), count).T.copy()


def gptq_default_g_idx(in_features: int, group_size: int) -> np.ndarray:
    """The g_idx of a checkpoint without act-order: ``i // group_size`` (int32 [in])."""
    return (np.arange(in_features) // group_size).astype(np.int32)


def _check_version(version: str) -> None:
    """Refuse a checkpoint_format other than "gptq" (v1) and "gptq_v2"."""
    if version not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format must be 'gptq' or 'gptq_v2', got {version!r}")


def gptq_pack(
    q_unsigned: np.ndarray,
    z: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray,
    bits: int,
    version: str = "gptq",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ tensors from codes q [in, out], true zeros z [groups, out] (both in [0, 2^b - 1]), scales.

    Returns ``(qweight int32 [ceil(in*b/32), out], qzeros int32 [groups, ceil(out*b/32)], scales
    float16 [groups, out], g_idx int32 [in])``. "gptq" (v1) stores z - 1 masked to b bits (a true
    zero of 0 is stored as all ones); "gptq_v2" stores z.
    """
    _check_version(version)
    top = (1 << bits) - 1
    q = _check_codes(q_unsigned, 0, top, "q")
    zz = _check_codes(z, 0, top, "z")
    g_idx = np.asarray(g_idx).astype(np.int32)
    if g_idx.shape != (q.shape[0],) or zz.shape[1] != q.shape[1] or np.shape(scales) != zz.shape:
        raise ValueError("g_idx must be [in], z and scales [groups, out]")
    stored = (zz - 1) & top if version == "gptq" else zz
    qzeros = np.ascontiguousarray(_gptq_words(stored.T, bits).T)
    return _gptq_words(q, bits), qzeros, np.asarray(scales).astype(np.float16), g_idx


def gptq_unpack(
    qweight: np.ndarray, qzeros: np.ndarray, in_features: int, out_features: int, bits: int, version: str = "gptq"
) -> tuple[np.ndarray, np.ndarray]:
    """The codes q [in, out] and true zeros z [groups, out] (int64) of GPTQ tensors.

    v1 zeros are (stored + 1) masked to b bits, as AutoGPTQ's torch dequantiser reads them (so the
    all-ones word written for a true zero of 0 reads back as 0).
    """
    _check_version(version)
    q = _gptq_values(qweight, bits, in_features)
    stored = _gptq_values(np.ascontiguousarray(np.asarray(qzeros).T), bits, out_features).T
    z = (stored + 1) & ((1 << bits) - 1) if version == "gptq" else stored
    return q, np.ascontiguousarray(z)


def gptq_dequantize(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray, bits: int, version: str = "gptq"
) -> np.ndarray:
    """``w[i, n] = scales[g_idx[i], n] * (q[i, n] - z[g_idx[i], n])`` in float16; returns [out, in]."""
    s = np.asarray(scales).astype(np.float32)
    q, z = gptq_unpack(qweight, qzeros, len(g_idx), s.shape[1], bits, version)
    f16 = np.dtype(np.float16)
    w = np.zeros(q.shape, dtype=np.float32)
    for i in range(q.shape[0]):
        g = int(g_idx[i])
        for n in range(q.shape[1]):
            w[i, n] = _rnd(s[g, n] * _rnd(q[i, n] - z[g, n], f16), f16)
    return w.astype(np.float16).T.copy()


# --- ggml Q4_0 / Q8_0 ---
def _block_args(q: np.ndarray, d: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """q as int64 [n/32, 32] and d as float16 [n/32], checked (row-major order of both)."""
    q = _check_codes(q, lo, hi, "q")
    if q.size % QK:
        raise ValueError("ggml blocks need a multiple of 32 values per row")
    d = np.asarray(d).astype(np.float16).reshape(-1)
    blocks = q.reshape(-1, QK)
    if d.size != blocks.shape[0]:
        raise ValueError("d needs one float16 per block of 32")
    return blocks, d


def q4_0_blocks(q: np.ndarray, d: np.ndarray) -> bytes:
    """block_q4_0 bytes: per 32 values, d (float16 LE), then byte j = (q[j] + 8) | (q[j + 16] + 8) << 4."""
    blocks, d = _block_args(q, d, -8, 7)
    out = bytearray()
    for b in range(blocks.shape[0]):
        out += d[b : b + 1].astype("<f2").tobytes()
        for j in range(QK // 2):
            out.append((int(blocks[b, j]) + 8) | ((int(blocks[b, j + 16]) + 8) << 4))
    return bytes(out)


def q8_0_blocks(q: np.ndarray, d: np.ndarray) -> bytes:
    """block_q8_0 bytes: per 32 values, d (float16 LE), then the 32 int8 codes."""
    blocks, d = _block_args(q, d, -128, 127)
    out = bytearray()
    for b in range(blocks.shape[0]):
        out += d[b : b + 1].astype("<f2").tobytes()
        out += blocks[b].astype(np.int8).tobytes()
    return bytes(out)


def _raw_blocks(raw: bytes | np.ndarray, n: int, block_bytes: int) -> np.ndarray:
    """The bytes of n / 32 blocks as uint8 [n/32, block_bytes]."""
    data = np.frombuffer(raw.tobytes() if isinstance(raw, np.ndarray) else bytes(raw), dtype=np.uint8)
    if n % QK or data.size != n // QK * block_bytes:
        raise ValueError("raw does not hold n / 32 blocks")
    return data.reshape(-1, block_bytes)


def dequant_q4_0(raw: bytes | np.ndarray, n: int) -> np.ndarray:
    """float32 [n]: value j of a block is (nibble - 8) * float32(d)."""
    blocks = _raw_blocks(raw, n, 2 + QK // 2)
    out = np.zeros(n, dtype=np.float32)
    for b, blk in enumerate(blocks):
        d = np.float32(blk[:2].view("<f2")[0])
        for j in range(QK // 2):
            out[b * QK + j] = np.float32((int(blk[2 + j]) & 0xF) - 8) * d
            out[b * QK + j + 16] = np.float32((int(blk[2 + j]) >> 4) - 8) * d
    return out


def dequant_q8_0(raw: bytes | np.ndarray, n: int) -> np.ndarray:
    """float32 [n]: value j of a block is qs[j] * float32(d)."""
    blocks = _raw_blocks(raw, n, 2 + QK)
    out = np.zeros(n, dtype=np.float32)
    for b, blk in enumerate(blocks):
        d = np.float32(blk[:2].view("<f2")[0])
        for j, code in enumerate(blk[2:].view(np.int8)):
            out[b * QK + j] = np.float32(int(code)) * d
    return out
