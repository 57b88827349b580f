"""Mutations that know the files' structure, besides libFuzzer's byte-level ones: a number of a
header set near a boundary (0, -1, 2^31, 2^32, 2^63, 2^64 and their neighbours), a field of the
wrong type, JSON nested thousands deep, byte ranges that overlap or leave gaps, a file cut at a
field's boundary, a GGUF array of arrays, ``general.alignment`` of another type or size.

:func:`mutate` takes one file's bytes and returns them changed, or None for a file of no
structure it knows (the caller then mutates bytes).
"""

from __future__ import annotations

import io
import json
import random
import struct
import zipfile
from typing import Any

__all__ = ["mutate"]

INTERESTING = (
    0, 1, 2, 3, 7, 8, 16, 31, 32, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1,
    2**40, 2**62, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, -1, -2, -(2**31), -(2**63),
)  # fmt: skip
_BIG = (2**64, 2**64 + 1, 10**20, 2**100)


def _number(rng: random.Random, old: Any = None) -> Any:
    r = rng.random()
    if r < 0.7:
        return rng.choice(INTERESTING)
    if r < 0.8:
        return rng.choice(_BIG)
    if r < 0.9 and isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice((-1, 1, -8, 8, old, -old))
    return rng.choice((0.5, 1e300, -0.0, True, False, None))


def _deep(rng: random.Random) -> Any:
    depth = rng.choice((130, 200, 1000, 3000))
    value: Any = rng.choice((1, "x", None))
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def _other_value(rng: random.Random, old: Any) -> Any:
    r = rng.random()
    if r < 0.45:
        return _number(rng, old)
    if r < 0.55:
        return _deep(rng)
    if r < 0.65:
        return [old] if rng.random() < 0.5 else {"k": old}
    if r < 0.75:
        return rng.choice(("", "x", "F32", "BF16", "F8_E4M3", "nvfp4", "a\nb", "\udcff", "../x", "/etc/passwd"))
    if r < 0.85:
        return [_number(rng) for _ in range(rng.choice((0, 1, 2, 3, 5)))]
    return rng.choice(([], {}, None, "", [[1, 2]], {"a": "b"}))


def _paths(doc: Any, most: int = 2000) -> list[tuple[Any, Any]]:
    """(container, key) of every value in ``doc``, breadth first (at most ``most``)."""
    out: list[tuple[Any, Any]] = []
    queue = [doc]
    while queue and len(out) < most:
        item = queue.pop(0)
        pairs = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for k, v in pairs:
            out.append((item, k))
            queue.append(v)
    return out


def mutate_json(doc: Any, rng: random.Random, prefer: tuple[str, ...] = ()) -> Any:
    """``doc`` (a parsed JSON value) with one value changed, added or removed."""
    paths = _paths(doc)
    if not paths:
        return _other_value(rng, doc)
    if prefer and rng.random() < 0.6:  # the fields named, and the items of lists (shapes, offsets)
        preferred = [p for p in paths if p[1] in prefer] + [p for p in paths if isinstance(p[0], list)]
        if preferred:
            paths = preferred
    container, key = rng.choice(paths)
    r = rng.random()
    if r < 0.1 and isinstance(container, dict):
        del container[key]
    elif r < 0.15 and isinstance(container, list):
        container.append(_number(rng))
    elif r < 0.2 and isinstance(container, list) and container:
        container.pop()
    else:
        container[key] = _other_value(rng, container[key])
    return doc


def _dumps(doc: Any, rng: random.Random) -> bytes:
    try:
        text = json.dumps(doc, separators=(",", ":") if rng.random() < 0.5 else None)
    except (RecursionError, ValueError):
        text = "[" * 5000
    return text.encode("utf-8", "surrogatepass")


# ---- safetensors ---------------------------------------------------------------------------------------


def _safetensors(raw: bytes, rng: random.Random) -> bytes | None:
    n = int.from_bytes(raw[:8], "little")
    try:
        header = json.loads(raw[8 : 8 + n])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    data = raw[8 + n :]
    names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    r = rng.random()
    if r < 0.45 or not names:
        header = mutate_json(header, rng, ("dtype", "shape", "data_offsets", "__metadata__"))
    elif r < 0.6:  # two tensors' byte ranges overlapping or apart
        a = header[rng.choice(names)]
        b = header[rng.choice(names)]
        if isinstance(a.get("data_offsets"), list) and isinstance(b.get("data_offsets"), list):
            a["data_offsets"] = list(b["data_offsets"])
    elif r < 0.7:  # a shape whose product wraps in int64, or holds more than its bytes
        t = header[rng.choice(names)]
        t["shape"] = rng.choice(
            ([2**32, 2**32], [2**63], [2**64 - 1, 1], [2**62, 4], [0, 2**63], [-1], [2**32, 2**32, 0])
        )
    elif r < 0.8:  # the data cut at a tensor's boundary, or bytes after it
        ends = sorted({t["data_offsets"][1] for t in map(header.get, names) if isinstance(t.get("data_offsets"), list)})
        if rng.random() < 0.5 and ends:
            data = data[: rng.choice(ends) - rng.choice((0, 1))]
        else:
            data += bytes(rng.choice((1, 8, 100)))
    elif r < 0.9:  # the header's length field
        body = _dumps(header, rng)
        return (
            struct.pack("<Q", rng.choice((0, 1, 7, len(body) - 1, len(body) + 1, 2**63, 2**64 - 1, 100_000_001)))
            + body
            + data
        )
    else:
        header["__metadata__"] = _other_value(rng, header.get("__metadata__"))
    body = _dumps(header, rng)
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body + data


# ---- .npy ----------------------------------------------------------------------------------------------


def _npy(raw: bytes, rng: random.Random) -> bytes | None:
    major = raw[6] if len(raw) > 7 else 1
    width = 2 if major == 1 else 4
    if len(raw) < 8 + width:
        return None
    length = int.from_bytes(raw[8 : 8 + width], "little")
    head = raw[8 + width : 8 + width + length]
    data = raw[8 + width + length :]
    r = rng.random()
    if r < 0.5:
        text = head.decode("latin1")
        import ast

        try:
            d = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if not isinstance(d, dict):
            return None
        key = rng.choice(("shape", "shape", "shape", "descr", "fortran_order"))
        if key == "shape":
            d["shape"] = (
                rng.choice(
                    ((2**64,), (2**32, 2**32), (-1,), (2**63 - 1,), (0, 2**63), (True,), (1.5,), [4, 4], (1,) * 40, ())
                )
                if rng.random() < 0.6
                else tuple(rng.choice(INTERESTING) for _ in range(rng.choice((1, 2, 3))))
            )
        elif key == "descr":
            d["descr"] = rng.choice(
                ("<f4", "|O", "|V0", "<U0", "<U2147483647", [("a", "<f4", (2**31,))], ("<f4",), 5, "x", "<M8[D]", "|b1")
            )
        else:
            d["fortran_order"] = rng.choice((True, False, 1, "yes", None))
        text = repr(d) if rng.random() < 0.9 else repr(d) + "L" * rng.choice((1, 5))
        head = text.encode("latin1", "replace")
        head += b" " * (-(8 + width + len(head) + 1) % 64) + b"\n"
        length = len(head)
    elif r < 0.65:
        raw = bytearray(raw)
        raw[6 + rng.choice((0, 1))] = rng.choice((0, 1, 2, 3, 4, 255))
        return bytes(raw)
    elif r < 0.8:
        length = rng.choice((0, 1, length - 1, length + 1, 2**16 - 1, 2**32 - 1, 10_001, 40_001))
    else:
        cut = rng.choice((0, 1, 6, 8, 8 + width, 8 + width + length // 2, 8 + width + length, len(raw) - 1))
        return raw[:cut]
    fmt = "<H" if width == 2 else "<I"
    length = min(length, 2 ** (8 * width) - 1)
    return raw[:8] + struct.pack(fmt, length) + head + data


# ---- .npz ----------------------------------------------------------------------------------------------


def _npz(raw: bytes, rng: random.Random) -> bytes | None:
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            members = [(info, zf.read(info)) for info in zf.infolist()]
    except Exception:  # noqa: BLE001 - not a zip this can rewrite: bytes instead
        return None
    if not members:
        return None
    out = io.BytesIO()
    pick = rng.randrange(len(members))
    r = rng.random()
    with zipfile.ZipFile(out, "w") as zf:
        for i, (info, content) in enumerate(members):
            if i == pick:
                if content[:6] == b"\x93NUMPY":
                    inner = _npy(content, rng)
                    if inner is not None and info.filename.endswith("meta.npy") and rng.random() < 0.6:
                        inner = _meta(content, rng)
                    content = inner if inner is not None else content
                if r < 0.1:
                    info.filename = members[(i + 1) % len(members)][0].filename  # a name twice
            zf.writestr(info, content)
    data = bytearray(out.getvalue())
    if r > 0.9 and len(data) > 30:  # a size field of a local header
        at = rng.choice((18, 22))
        data[at : at + 4] = struct.pack("<I", rng.choice((0, 1, 2**31, 2**32 - 1)))
    return bytes(data)


def _meta(content: bytes, rng: random.Random) -> bytes | None:
    """A block file's ``meta.npy`` (UTF-8 JSON as uint8) with its JSON mutated."""
    major = content[6]
    width = 2 if major == 1 else 4
    length = int.from_bytes(content[8 : 8 + width], "little")
    start = 8 + width + length
    try:
        doc = json.loads(content[start:])
    except ValueError:
        return None
    body = _dumps(mutate_json(doc, rng, ("shape", "axis", "block_size", "fmt", "packed", "per_tensor_scale")), rng)
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.frombuffer(body, np.uint8))
    return buf.getvalue()


# ---- GGUF ----------------------------------------------------------------------------------------------

_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class _Fields:
    """Where the numbers of a GGUF header are: (offset, width, role) of each, and the offsets
    where a field ends (to cut the file there)."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.pos = raw, 24
        self.numbers: list[tuple[int, int, str]] = [(8, 8, "n_tensors"), (16, 8, "n_kv")]
        self.ends: list[int] = [4, 8, 16, 24]
        self.alignment: tuple[int, int] | None = None  # (type offset, value offset)

    def u(self, width: int, role: str) -> int:
        value = int.from_bytes(self.raw[self.pos : self.pos + width], "little")
        if self.pos + width > len(self.raw):
            raise IndexError
        self.numbers.append((self.pos, width, role))
        self.pos += width
        return value

    def string(self, role: str) -> bytes:
        n = self.u(8, role + " length")
        text = self.raw[self.pos : self.pos + n]
        self.pos += n
        return text

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in _SCALAR_SIZE:
            self.u(_SCALAR_SIZE[kind], "value")
        elif kind == 8:
            self.string("string")
        elif kind == 9 and depth < 3:
            item = self.u(4, "array type")
            count = self.u(8, "array count")
            for _ in range(min(count, 64)):
                self.value(item, depth + 1)
            if count > 64:
                raise IndexError
        else:
            raise IndexError

    def scan(self) -> None:
        n_tensors = int.from_bytes(self.raw[8:16], "little")
        n_kv = int.from_bytes(self.raw[16:24], "little")
        for _ in range(min(n_kv, 10_000)):
            key = self.string("key")
            type_at = self.pos
            kind = self.u(4, "value type")
            value_at = self.pos
            self.value(kind)
            self.ends.append(self.pos)
            if key == b"general.alignment":
                self.alignment = (type_at, value_at)
        for _ in range(min(n_tensors, 10_000)):
            self.string("tensor name")
            n_dims = self.u(4, "n_dims")
            for _ in range(min(n_dims, 8)):
                self.u(8, "dimension")
            self.u(4, "tensor type")
            self.u(8, "tensor offset")
            self.ends.append(self.pos)


def _gguf(raw: bytes, rng: random.Random) -> bytes | None:
    fields = _Fields(raw)
    try:
        fields.scan()
    except (IndexError, struct.error):
        pass
    data = bytearray(raw)
    r = rng.random()
    if r < 0.55 and fields.numbers:
        roles = [f for f in fields.numbers if f[2] in ("dimension", "tensor offset", "n_dims", "tensor type")]
        at, width, role = rng.choice(roles if roles and rng.random() < 0.5 else fields.numbers)
        value = _number(rng) if role != "value type" else rng.choice((9, 8, 13, 255, 2**32 - 1))
        value = value if isinstance(value, int) and not isinstance(value, bool) else 0
        data[at : at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        return bytes(data)
    if r < 0.7:  # cut at a field's boundary
        end = rng.choice(fields.ends)
        return bytes(data[: max(0, end - rng.choice((0, 1, 4)))])
    if r < 0.85:  # general.alignment: another type, a huge power of two, or one added
        value = rng.choice((2**31, 2**20, 64, 0, 3, 2**30))
        if fields.alignment is not None:
            type_at, value_at = fields.alignment
            if rng.random() < 0.3:  # stored as a UINT64: rewrite the entry's value
                return bytes(data[:type_at] + struct.pack("<IQ", 10, value) + data[value_at + 4 :])
            data[value_at : value_at + 4] = struct.pack("<I", value % 2**32)
            return bytes(data)
        key = b"general.alignment"
        kind, packed = (10, struct.pack("<Q", value)) if rng.random() < 0.3 else (4, struct.pack("<I", value % 2**32))
        entry = struct.pack("<Q", len(key)) + key + struct.pack("<I", kind) + packed
        n_kv = int.from_bytes(raw[16:24], "little") + 1
        return bytes(raw[:16] + struct.pack("<Q", n_kv) + entry + raw[24:])
    # an entry holding an array of arrays, nested deep (gguf-py reads nested arrays recursively)
    depth = rng.choice((2, 5, 50, 2000))
    key = b"fuzz.nested"
    value = struct.pack("<IQ", 4, 0)
    for _ in range(depth):
        value = struct.pack("<IQ", 9, 1) + value
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + value
    n_kv = int.from_bytes(raw[16:24], "little") + 1
    return bytes(raw[:16] + struct.pack("<Q", n_kv) + entry + raw[24:])


# ---- any file ------------------------------------------------------------------------------------------


def mutate(payload: bytes, rng: random.Random) -> bytes | None:
    """One file's bytes changed where their structure is known here (see the module docstring)."""
    try:
        if payload[:4] == b"GGUF":
            return _gguf(payload, rng)
        if payload[:6] == b"\x93NUMPY":
            return _npy(payload, rng)
        if payload[:2] == b"PK":
            return _npz(payload, rng)
        if len(payload) > 9 and payload[8:9] == b"{":
            return _safetensors(payload, rng)
        if payload.lstrip()[:1] in (b"{", b"["):
            doc = json.loads(payload)
            return _dumps(mutate_json(doc, rng), rng)
    except Exception:  # noqa: BLE001 - a mutation that does not apply: the caller mutates bytes instead
        return None
    return None
