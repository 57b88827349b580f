"""Files from strangers (issue 55): each class of corrupt or hostile input found by mutating the
package's own outputs, rebuilt here from them and refused in one line naming the file and what is
wrong, exit status 2, nothing written (``command_checks.fails``); where the class was an allocation
or a write in proportion to a header's number, in a process of its own whose peak memory stays
under 200 MB (``tests/memory.py``). Where a format's own reader is the reference (safetensors'
``deserialize``, gguf-py's ``GGUFReader``, numpy's ``np.load``), the test shows that it refuses the
file too, so that the package is never laxer than it.

The inputs are built from what the package writes: a checkpoint it quantised, its ``cast`` of an
``.npz`` to ``.safetensors`` and ``.npy``, its block file, its NVFP4 GGUF file; then one field is
changed, as the fuzzer (``tests/fuzz/``) changes them.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import neuron_kernels as nk
from neuron_kernels.io.arrays import FileFormatError, open_arrays
from neuron_kernels.io.gguf_file import open_gguf

from .cli_runner import run
from .command_checks import fails
from .gguf_models import tiny_llama_gguf
from .helpers import child_env
from .memory import REPORT_PEAK

PEAK_MIB = 200


# ---- the package's own outputs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The package's outputs every test mutates a copy of: ``plain/`` (a checkpoint of the package's
    ``.safetensors``), ``ct/`` (it quantised to NVFP4, compressed-tensors), ``x.npy`` and
    ``x.safetensors`` (its casts), ``b.npz`` (its block file), ``q.gguf`` (its NVFP4 GGUF file)."""
    d = tmp_path_factory.mktemp("made")
    rng = np.random.default_rng(55)
    np.savez(d / "src.npz", **{"l.up_proj.weight": rng.standard_normal((64, 128)).astype(np.float32)})
    run("cast", "src.npz", "x.safetensors", "--to", "bfloat16", cwd=d)
    (d / "plain").mkdir()
    shutil.copy(d / "x.safetensors", d / "plain" / "model.safetensors")
    (d / "plain" / "config.json").write_text("{}")
    run("quantize", "plain", "ct", "--format", "nvfp4", "--only", "*", cwd=d)
    np.save(d / "src.npy", rng.standard_normal((16, 64)).astype(np.float32))
    run("cast", "src.npy", "x.npy", "--to", "float16", cwd=d)
    run("quantize", "src.npy", "b.npz", "--format", "mxfp4_e2m1", cwd=d)
    tiny_llama_gguf(d / "t.gguf", n_embd=64, n_ff=128, n_layer=1, n_head=2, n_kv=1)
    run("quantize", "t.gguf", "q.gguf", "--format", "nvfp4", cwd=d)
    return d


def _copy(made, name, tmp_path, to=None):
    src, dst = made / name, tmp_path / (to or name)
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


def st_read(path):
    """(header, data) of a ``.safetensors`` file, parsed here (not by the package)."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def st_write(path, header, data, text=None):
    body = (text if text is not None else json.dumps(header)).encode()
    with open(path, "wb") as fh:
        fh.write(len(body).to_bytes(8, "little") + body + data)


def st_mutated(made, tmp_path, change, name="m"):
    """A copy of the quantised checkpoint ``ct/`` whose shard header ``change(header)`` alters."""
    folder = _copy(made, "ct", tmp_path, name)
    header, data = st_read(folder / "model.safetensors")
    data = change(header, data) or data
    st_write(folder / "model.safetensors", header, data)
    return folder


def first_tensor(header):
    return next(k for k in header if k != "__metadata__")


def safetensors_refuses(path) -> bool:
    """Whether safetensors' own reader refuses the file."""
    import safetensors

    try:
        safetensors.deserialize(Path(path).read_bytes())
    except Exception:  # noqa: BLE001 - any refusal
        return True
    return False


def peak(args, cwd):
    """(exit status, stderr lines but the peak, peak MiB) of the command in a process of its own."""
    # A process of its own: its peak memory (VmHWM) is what is measured.
    r = subprocess.run(
        [sys.executable, "-c", REPORT_PEAK, *map(str, args)],
        cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [line for line in r.stderr.splitlines() if not line.startswith("VmHWM")]
    return r.returncode, lines, int(re.search(r"VmHWM:\s*(\d+) kB", r.stderr).group(1)) / 1024


def refused_in_bounded_memory(args, cwd, message, output):
    status, lines, mib = peak(args, cwd)
    assert status == 2 and len(lines) == 1 and message in lines[0], (status, lines)
    assert not os.path.exists(os.path.join(cwd, output))
    assert not [n for n in os.listdir(cwd) if n.startswith(".partial")]
    assert mib < PEAK_MIB, f"peak {mib:.0f} MiB"


# ---- GGUF fields, located in the package's output -----------------------------------------------------


def gguf_tensor_info(raw: bytes, name: str) -> int:
    """The offset of the dimension count of tensor ``name`` in the tensor table."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = raw.rindex(key)  # the tensor table follows the metadata
    return at + len(key)


def gguf_with_entry(raw: bytes, entry: bytes) -> bytes:
    """``raw`` with one more metadata entry (key, type, value bytes) first."""
    n_kv = struct.unpack_from("<Q", raw, 16)[0]
    return raw[:16] + struct.pack("<Q", n_kv + 1) + entry + raw[24:]


def gguf_entry(key: str, kind: int, value: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value


def gguf_refuses(path) -> bool:
    import gguf

    try:
        gguf.GGUFReader(path)
    except Exception:  # noqa: BLE001 - any refusal
        return True
    return False


# ---- row 1: a traceback, exit 1 -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [["F32"], {"a": "F32"}])
def test_safetensors_dtype_of_another_type(made, tmp_path, dtype):
    st_mutated(made, tmp_path, lambda h, d: h[first_tensor(h)].update(dtype=dtype))
    fails("check", "m", cwd=tmp_path, message="safetensors dtype")
    fails("dequantize", "m", "o", cwd=tmp_path, message="safetensors dtype")


def test_safetensors_shape_number_of_2_63_or_more(made, tmp_path):
    st_mutated(made, tmp_path, lambda h, d: h[first_tensor(h)].update(shape=[2**63, 1]))
    assert safetensors_refuses(tmp_path / "m" / "model.safetensors")
    fails("check", "m", cwd=tmp_path, message="shape [9223372036854775808, 1]")


def test_safetensors_header_nested_1000_deep(made, tmp_path):
    deep = "[" * 1000 + "]" * 1000
    st_mutated(made, tmp_path, lambda h, d: h.update(x=deep))

    def text(folder):
        header, data = st_read(folder / "model.safetensors")
        raw = json.dumps(header).replace(json.dumps(deep), deep)
        st_write(folder / "model.safetensors", None, data, raw)

    text(tmp_path / "m")
    fails("quantize", "m", "o", "--format", "mxfp4_e2m1", cwd=tmp_path, message="nested deeper than 128 levels")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_config_or_index_nested_1000_deep(made, tmp_path, name):
    folder = _copy(made, "ct", tmp_path, "m")
    if name.startswith("model"):
        header, _ = st_read(folder / "model.safetensors")
        index = {"weight_map": dict.fromkeys((k for k in header if k != "__metadata__"), "model.safetensors")}
        text = json.dumps(index)[:-1] + ', "deep": ' + "[" * 1000 + "]" * 1000 + "}"
    else:
        text = (folder / name).read_text()[:-2] + ', "deep": ' + "[" * 1000 + "]" * 1000 + "}"
    (folder / name).write_text(text)
    fails("dequantize", "m", "o", cwd=tmp_path, message="nested deeper than 128 levels")
    fails("check", "m", cwd=tmp_path, message="nested deeper than 128 levels")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": ["nvfp4-pack-quantized"]}, "quantization_config.format is an array; a string is read"),
        ({"config_groups": 7}, "quantization_config.config_groups is 7; an object is read"),
        ({"ignore": 5}, "quantization_config.ignore is 5; an array of strings is read"),
        (
            {"config_groups": {"g": {"weights": {"strategy": "block", "block_structure": [0, 0]}}}},
            "quantization_config.config_groups.g.weights.block_structure[0] is 0; a positive integer is read",
        ),
    ],
)
def test_quantization_config_fields_of_another_type(made, tmp_path, change, message):
    folder = _copy(made, "ct", tmp_path, "m")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(change)
    (folder / "config.json").write_text(json.dumps(config))
    fails("dequantize", "m", "o", cwd=tmp_path, message=message)
    fails("check", "m", cwd=tmp_path, message=message)


def test_hf_quant_config_a_json_string(made, tmp_path):
    folder = _copy(made, "ct", tmp_path, "m")
    (folder / "hf_quant_config.json").write_text('"modelopt"')
    fails("check", "m", cwd=tmp_path, message="hf_quant_config.json: not a JSON object (a JSON string)")


def test_gguf_array_of_arrays_2000_deep(made, tmp_path):
    raw = (made / "q.gguf").read_bytes()
    value = struct.pack("<IQ", 9, 1) * 2000 + struct.pack("<IQ", 4, 0)
    (tmp_path / "a.gguf").write_bytes(gguf_with_entry(raw, gguf_entry("x.nested", 9, value)))
    fails("dequantize", "a.gguf", "o.gguf", cwd=tmp_path, message="arrays nested more than 4 deep")


def test_gguf_tensor_with_a_0_dimension_is_kept(made, tmp_path):
    """ggml reads a tensor of no element (its reader's count check skips it): quantised, it is kept
    as it is, and the output reads back (in gguf-py's reader too) with the same shape."""
    raw = bytearray((made / "t.gguf").read_bytes())
    at = gguf_tensor_info(raw, "blk.0.ffn_up.weight")
    n_dims, ne0, ne1 = struct.unpack_from("<IQQ", raw, at)
    assert n_dims == 2
    struct.pack_into("<Q", raw, at + 12, 0)  # ne1 = 0: no row
    # its data now takes no byte: the offsets of the tensors after it move back by its size (a
    # multiple of the alignment, 32); their bytes stay where they are, read from the new offsets
    size = ne0 * ne1 * 4
    order = [t.name for t in open_gguf(made / "t.gguf").tensors.values()]
    for name in order[order.index("blk.0.ffn_up.weight") + 1 :]:
        where = gguf_tensor_info(raw, name)
        offset_at = where + 4 + 8 * struct.unpack_from("<I", raw, where)[0] + 4
        struct.pack_into("<Q", raw, offset_at, struct.unpack_from("<Q", raw, offset_at)[0] - size)
    (tmp_path / "z.gguf").write_bytes(bytes(raw))
    r = run("quantize", "z.gguf", "o.gguf", "--format", "nvfp4", cwd=tmp_path)
    assert "no elements" in r.stdout
    import gguf

    shapes = {t.name: tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(tmp_path / "o.gguf").tensors}
    assert shapes["blk.0.ffn_up.weight"] == (ne0, 0)


def test_gguf_nvfp4_scale_of_32_values_for_one_matrix(made, tmp_path):
    order = list(open_gguf(made / "q.gguf").tensors)
    assert order[-1] == "blk.0.ffn_down.scale"  # the last tensor: its data can grow at the file's end
    raw = bytearray((made / "q.gguf").read_bytes())
    at = gguf_tensor_info(raw, "blk.0.ffn_down.scale")
    n_dims, ne0 = struct.unpack_from("<IQ", raw, at)
    assert (n_dims, ne0) == (1, 1)
    struct.pack_into("<Q", raw, at + 4, 32)
    raw += np.ones(24, np.float32).tobytes()  # 32 float32 values: the 8 of its padded 32 bytes and these
    (tmp_path / "s.gguf").write_bytes(bytes(raw))
    fails("dequantize", "s.gguf", "o.gguf", cwd=tmp_path, message="32 per-tensor scales for blk.0.ffn_down.weight")


def test_npy_version_byte_3_and_corrupt_headers(made, tmp_path):
    """A version byte of 3 on a 1.0 header (its length field is then 4 bytes, not 2), and headers
    whose dict is never closed (numpy 1.x and 2.x hand those to ``tokenize``, whose TokenError
    escaped): one line each, naming the file, from the command and from the functions."""
    raw = bytearray((made / "x.npy").read_bytes())
    raw[6] = 3
    (tmp_path / "v3.npy").write_bytes(bytes(raw))
    fails("cast", "v3.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path, message="v3.npy: not a valid .npy array")
    with pytest.raises(FileFormatError, match="not a valid .npy array"):
        open_arrays(tmp_path / "v3.npy")
    raw = (made / "x.npy").read_bytes()
    (tmp_path / "open.npy").write_bytes(raw.replace(b"}", b" ", 1))
    fails("cast", "open.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path, message="open.npy: not a valid .npy array")
    blocks = (made / "b.npz").read_bytes()
    at = blocks.index(b"}", blocks.index(b"'descr'"))
    (tmp_path / "h.npz").write_bytes(blocks[:at] + b" " + blocks[at + 1 :])  # the member's CRC-32 no longer holds
    fails("dequantize", "h.npz", "o.npy", cwd=tmp_path, message="h.npz[meta]: not a valid .npy array")
    with pytest.raises(FileFormatError, match="h.npz"):
        nk.load_blocks(tmp_path / "h.npz")


def npy_with_shape(made, tmp_path, name, shape):
    raw = (made / "x.npy").read_bytes()
    length = struct.unpack_from("<H", raw, 8)[0]
    header = f"{{'descr': '<f2', 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    header += b" " * (length - 1 - len(header)) + b"\n"
    (tmp_path / name).write_bytes(raw[:10] + header + raw[10 + length :])


def test_npy_shape_2_64(made, tmp_path):
    npy_with_shape(made, tmp_path, "big.npy", (2**64,))
    fails("cast", "big.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path, message="big.npy")


def npy_header_in(raw: bytes, member: bytes, header: str) -> bytes:
    """``raw`` (a zip) with the ``.npy`` header of the stored ``member`` replaced by ``header``, padded
    to the same length (the member's CRC-32 no longer matches: the header is refused before)."""
    at = raw.index(b"\x93NUMPY", raw.index(member))
    length = struct.unpack_from("<H", raw, at + 8)[0]
    text = header.encode()
    assert len(text) < length
    return raw[: at + 10] + text + b" " * (length - 1 - len(text)) + b"\n" + raw[at + 10 + length :]


def test_block_file_meta_of_shape_2_32_by_2_32(made, tmp_path):
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"
    (tmp_path / "m.npz").write_bytes(npy_header_in((made / "b.npz").read_bytes(), b"meta.npy", header))
    fails("dequantize", "m.npz", "o.npy", cwd=tmp_path, message="m.npz")
    with pytest.raises(FileFormatError, match="meta"):
        nk.load_blocks(tmp_path / "m.npz")


# ---- row 2: a giant allocation ---------------------------------------------------------------------------


def test_gguf_alignment_2_40_stored_as_u64(made, tmp_path):
    raw = (made / "q.gguf").read_bytes()
    entry = gguf_entry("general.alignment", 10, struct.pack("<Q", 2**40))
    (tmp_path / "a.gguf").write_bytes(gguf_with_entry(raw, entry))
    assert gguf_refuses(tmp_path / "a.gguf")
    refused_in_bounded_memory(
        ["dequantize", "a.gguf", "o.gguf"], tmp_path, "general.alignment is stored as GGUF type 10", "o.gguf"
    )


def test_gguf_alignment_larger_than_the_file(made, tmp_path):
    raw = (made / "q.gguf").read_bytes()
    entry = gguf_entry("general.alignment", 4, struct.pack("<I", 2**31))
    (tmp_path / "a.gguf").write_bytes(gguf_with_entry(raw, entry))
    refused_in_bounded_memory(
        ["quantize", "a.gguf", "o.gguf", "--format", "nvfp4"], tmp_path, "larger than the file", "o.gguf"
    )


def test_safetensors_wrapped_shape_no_cut_list(made, tmp_path):
    def change(h, d):
        name = first_tensor(h)
        begin = h[name]["data_offsets"][0]
        h[name].update(dtype="F32", shape=[2**32, 2**32], data_offsets=[begin, begin])

    folder = _copy(made, "plain", tmp_path, "p")
    header, data = st_read(folder / "model.safetensors")
    change(header, data)
    st_write(folder / "model.safetensors", header, data)
    refused_in_bounded_memory(
        ["quantize", "p", "o", "--format", "nvfp4", "--only", "*"], tmp_path, "not one numpy holds", "o"
    )


# ---- row 3: corrupt input accepted, exit 0 ------------------------------------------------------------


def test_safetensors_2_32_by_2_32_in_0_bytes_is_not_clean(made, tmp_path):
    def change(h, d):
        name = next(k for k in h if k.endswith("weight_global_scale"))
        begin = h[name]["data_offsets"][0]
        h[name].update(shape=[2**32, 2**32], data_offsets=[begin, begin])

    st_mutated(made, tmp_path, change)
    assert safetensors_refuses(tmp_path / "m" / "model.safetensors")
    fails("check", "m", cwd=tmp_path, message="model.safetensors")


@pytest.mark.parametrize("dims", [(2**32, 2**32), (2**64 - 1, 1)])
def test_gguf_shapes_that_wrap(made, tmp_path, dims):
    raw = bytearray((made / "q.gguf").read_bytes())
    at = gguf_tensor_info(raw, "output_norm.weight")
    assert struct.unpack_from("<I", raw, at)[0] == 1
    raw[at : at + 12] = struct.pack("<IQ", 2, dims[0])  # two dimensions: one more 8-byte field
    raw[at + 12 : at + 12] = struct.pack("<Q", dims[1])
    (tmp_path / "w.gguf").write_bytes(bytes(raw))
    fails("dequantize", "w.gguf", "o.gguf", cwd=tmp_path, message="w.gguf[output_norm.weight]")


def test_npy_2_32_by_2_32_cast(made, tmp_path):
    npy_with_shape(made, tmp_path, "w.npy", (2**32, 2**32))
    fails("cast", "w.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path, message="w.npy")


def test_npy_negative_shape_names_the_input(made, tmp_path):
    npy_with_shape(made, tmp_path, "n.npy", (-1,))
    line = fails("cast", "n.npy", "o.npy", "--to", "bfloat16", cwd=tmp_path, message="n.npy: shape [-1]")
    assert ".partial" not in line


# ---- row 4: laxer than the format's own reader ----------------------------------------------------------


def _gap(h, d):
    """Every tensor 8 bytes later: 8 bytes before the first that no tensor holds."""
    for k in h:
        if k != "__metadata__":
            b, e = h[k]["data_offsets"]
            h[k]["data_offsets"] = [b + 8, e + 8]
    return b"\0" * 8 + d


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h, d: d + b"\0" * 8, "byte(s) after the last tensor's data"),
        (lambda h, d: h.update(__metadata__=0), "__metadata__ must map names to strings"),
        (_gap, "leaves bytes [0, 8) unused"),
        (lambda h, d: h["__metadata__"].update(a="\udcff"), "is not UTF-8"),  # written as the escape \udcff
    ],
    ids=["trailing-bytes", "metadata-0", "gap", "lone-surrogate"],
)
def test_safetensors_what_its_own_reader_refuses(made, tmp_path, change, message):
    st_mutated(made, tmp_path, change)
    assert safetensors_refuses(tmp_path / "m" / "model.safetensors")
    fails("check", "m", cwd=tmp_path, message=message)


def test_safetensors_overlapping_offsets(made, tmp_path):
    def change(h, d):
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"])
        first, second = h[names[0]], h[names[1]]
        size = second["data_offsets"][1] - second["data_offsets"][0]
        begin = first["data_offsets"][1] - min(size, first["data_offsets"][1])  # inside the first one
        second["data_offsets"] = [begin, begin + size]

    st_mutated(made, tmp_path, change)
    assert safetensors_refuses(tmp_path / "m" / "model.safetensors")
    fails("check", "m", cwd=tmp_path, message="overlaps the tensor before it")


def test_gguf_what_gguf_py_refuses(made, tmp_path):
    raw = (made / "q.gguf").read_bytes()
    u64 = gguf_entry("general.alignment", 10, struct.pack("<Q", 64))
    (tmp_path / "u64.gguf").write_bytes(gguf_with_entry(raw, u64))
    key = struct.pack("<Q", 10) + b"general.\xff\xfe" + struct.pack("<I", 4) + struct.pack("<I", 1)
    (tmp_path / "key.gguf").write_bytes(gguf_with_entry(raw, key))
    for name, message in (("u64.gguf", "general.alignment is stored as GGUF type 10"), ("key.gguf", "utf-8")):
        assert gguf_refuses(tmp_path / name)
        fails("dequantize", name, "o.gguf", cwd=tmp_path, message=message)
    # a string value that is not UTF-8: gguf-py's contents() refuses it when read; the package reads every
    # string of the header, so it refuses the file
    value = struct.pack("<Q", 2) + b"\xff\xfe"
    (tmp_path / "value.gguf").write_bytes(gguf_with_entry(raw, gguf_entry("general.x", 8, value)))
    fails("dequantize", "value.gguf", "o.gguf", cwd=tmp_path, message="utf-8")


def test_npz_stored_member_of_another_crc(made, tmp_path):
    """numpy's np.load checks every member's CRC-32 (through zipfile); a byte of a stored member's
    data changed is refused on the first read."""
    raw = bytearray((made / "b.npz").read_bytes())
    at = raw.index(b"codes.npy")
    at = raw.index(b"\n", raw.index(b"NUMPY", at)) + 1  # the first byte of the codes' data
    raw[at] ^= 0xFF
    (tmp_path / "c.npz").write_bytes(bytes(raw))
    with pytest.raises(Exception):  # noqa: B017 - any refusal of numpy's
        np.load(tmp_path / "c.npz")["codes"]
    fails("dequantize", "c.npz", "o.npy", cwd=tmp_path, message="CRC-32")


# ---- row 5: the doctor ---------------------------------------------------------------------------------


def test_doctor_global_scale_of_1e_45(made, tmp_path):
    def change(h, d):
        name = next(k for k in h if k.endswith("weight_global_scale"))
        begin = h[name]["data_offsets"][0]
        return d[:begin] + np.array([1e-45], np.float32).tobytes() + d[begin + 4 :]

    st_mutated(made, tmp_path, change)
    r = run("check", "m", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "0 error(s)" not in r.stdout, r.stdout
    assert "beyond float32" in r.stdout
    fails("dequantize", "m", "o", cwd=tmp_path, message="beyond float32")


def test_doctor_block_scale_whose_values_overflow(made, tmp_path):
    """An NVFP4 weight whose global scale is the smallest its reciprocal allows: its largest
    values (6 x 448 x 1/gs) overflow float32; the doctor says so."""

    def change(h, d):
        name = next(k for k in h if k.endswith("weight_global_scale"))
        begin = h[name]["data_offsets"][0]
        return d[:begin] + np.array([3e-38], np.float32).tobytes() + d[begin + 4 :]

    st_mutated(made, tmp_path, change)
    r = run("check", "m", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "decode as NaN or infinity" in r.stdout, r.stdout


# ---- row 6: reading outside the input ------------------------------------------------------------------


@pytest.fixture
def secret(tmp_path):
    s = tmp_path / "elsewhere" / "id_rsa"
    s.parent.mkdir()
    s.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return s


def test_a_top_level_link_outside_is_refused(made, tmp_path, secret):
    folder = _copy(made, "ct", tmp_path, "m")
    os.symlink(secret, folder / "tokenizer.model")
    message = "m/tokenizer.model: a symbolic link to"
    fails("dequantize", "m", "o", cwd=tmp_path, message=message)
    fails("quantize", "m", "o", "--format", "mxfp4_e2m1", cwd=tmp_path, message=message)
    fails("check", "m", "--repair", "o", cwd=tmp_path, message=message)
    line = fails("check", "m", cwd=tmp_path, message="--follow-links")
    assert str(secret) in line
    # allowed: copied, as the user asked
    assert run("dequantize", "m", "o", "--follow-links", cwd=tmp_path).returncode == 0
    assert (tmp_path / "o" / "tokenizer.model").read_text() == secret.read_text()
    assert not (tmp_path / "o" / "tokenizer.model").is_symlink()
    assert run("check", "m", "--repair", "r", "--follow-links", cwd=tmp_path).returncode == 0


def test_a_shard_link_outside_is_refused(made, tmp_path):
    folder = _copy(made, "ct", tmp_path, "m")
    os.rename(folder / "model.safetensors", tmp_path / "shard.safetensors")
    os.symlink(tmp_path / "shard.safetensors", folder / "model.safetensors")
    fails("dequantize", "m", "o", cwd=tmp_path, message="m/model.safetensors: a symbolic link to")
    with pytest.raises(nk.checkpoints.LinkRefusedError):
        nk.load_checkpoint(folder)
    with nk.checkpoints.follow_links():
        assert nk.load_checkpoint(folder)


def hub_cache(made, root, repo="models--org--name"):
    """The Hugging Face cache's layout of ``ct/``: ``snapshots/REV/FILE`` links to ``../../blobs/HASH``."""
    import hashlib

    snapshot = root / repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (root / repo / "blobs").mkdir()
    for f in sorted((made / "ct").iterdir()):
        data = f.read_bytes()
        blob = root / repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob.name), snapshot / f.name)
    return snapshot


def test_the_hugging_face_cache_converts_without_the_option(made, tmp_path):
    snapshot = hub_cache(made, tmp_path / "hub")
    assert all(p.is_symlink() for p in snapshot.iterdir())
    assert run("dequantize", snapshot, "o", cwd=tmp_path).returncode == 0
    assert run("check", snapshot, cwd=tmp_path).returncode == 0
    assert run("quantize", snapshot, "q", "--format", "mxfp4_e2m1", "--only", "*", cwd=tmp_path).returncode == 0
    assert sorted(os.listdir(tmp_path / "o")) == sorted(os.listdir(snapshot))


def test_a_cache_whose_blobs_folder_is_a_link_is_not_trusted(made, tmp_path, secret):
    """A folder from anyone shaped as the cache, its ``blobs`` a link to a folder of this machine:
    the links into it are refused (only a real ``blobs/`` folder is the repository's)."""
    snapshot = hub_cache(made, tmp_path / "hub")
    blobs = tmp_path / "hub" / "models--org--name" / "blobs"
    for blob in blobs.iterdir():  # the blobs beside the secret, and blobs/ a link to that folder
        shutil.move(blob, secret.parent / blob.name)
    blobs.rmdir()
    os.symlink(secret.parent, blobs)
    os.symlink(os.path.join("..", "..", "blobs", "id_rsa"), snapshot / "tokenizer.model")
    fails("dequantize", snapshot, "o", cwd=tmp_path, message="outside the checkpoint folder")
