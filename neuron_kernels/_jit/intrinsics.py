"""The 32-bit integer intrinsics the kernels use.

Plain numba integer code widens ``uint32`` arithmetic to 64 bits, which halves the SIMD width
of the cast loops. The intrinsics below emit the 32-bit LLVM instruction directly; their
arguments are converted to ``uint32`` first, so literals can be passed as they are.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _u32_binop(op: str) -> Any:
    def typer(typingctx: Any, a: Any, b: Any) -> Any:
        sig = types.uint32(types.uint32, types.uint32)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return getattr(builder, op)(args[0], args[1])

        return sig, codegen

    typer.__name__ = f"u32_{op.strip('_')}"
    return intrinsic(typer)


u32_add = _u32_binop("add")
u32_sub = _u32_binop("sub")
u32_mul = _u32_binop("mul")
u32_shr = _u32_binop("lshr")
u32_shl = _u32_binop("shl")
u32_and = _u32_binop("and_")
u32_or = _u32_binop("or_")
u32_xor = _u32_binop("xor")


@intrinsic
def f32_bits(typingctx: Any, x: Any) -> Any:
    """The bit pattern of a float32 as a uint32 (a bitcast, no conversion)."""
    sig = types.uint32(types.float32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx: Any, u: Any) -> Any:
    """The float32 whose bit pattern is the uint32 ``u`` (a bitcast, no conversion)."""
    sig = types.float32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def i32_positive(typingctx: Any, u: Any) -> Any:
    """Whether the uint32 ``u``, read as a signed 32-bit integer, is greater than zero."""
    sig = types.boolean(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.icmp_signed(">", args[0], ir.Constant(ir.IntType(32), 0))

    return sig, codegen


@intrinsic
def f16_to_f32_bits(typingctx: Any, u: Any) -> Any:
    """The float32 pattern of the float16 pattern in the low 16 bits of the uint32 ``u``, by the
    hardware conversion (F16C's vcvtph2ps where the CPU has it). Exact for every number; a NaN
    comes out quiet (callers that keep signalling NaN payloads fix those up)."""
    sig = types.uint32(types.uint32)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        half = builder.bitcast(builder.trunc(args[0], ir.IntType(16)), ir.HalfType())
        return builder.bitcast(builder.fpext(half, ir.FloatType()), ir.IntType(32))

    return sig, codegen


@intrinsic
def u32_amax_abs(typingctx: Any, row: Any, start: Any, count: Any) -> Any:
    """``max(row[start + i] & sign mask for i < count)`` for a C-contiguous uint32 or uint16 ``row``
    (float32 patterns, or float16/bfloat16 codes) and a compile-time constant ``count``: one vector
    load and one reduction, no bounds check; the result as a uint32 (the 16-bit code's magnitude).

    A plain loop over a 32-element block runs at a quarter of the vector width (the vectoriser
    wants 64 iterations); this is the block amax of the block kernels. ``count == 0`` gives 0 for
    any ``row`` (the kernels pass 0 where they have no fixed block length), and so does a ``row``
    of another type (a float64 row in code shared by every source, where the call is never made).
    """
    if not isinstance(count, types.IntegerLiteral) or count.literal_value < 0:
        return None
    n = count.literal_value
    if n and not (
        isinstance(row, types.Array)
        and row.dtype in (types.uint32, types.uint16)
        and row.ndim == 1
        and row.layout == "C"
    ):
        n = 0
    bits = 32 if n == 0 or row.dtype == types.uint32 else 16
    sig = types.uint32(row, types.uint64, count)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        if n == 0:
            return ir.Constant(ir.IntType(32), 0)
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        lane = ir.IntType(bits)
        vty = ir.VectorType(lane, n)
        ptr = builder.bitcast(builder.gep(data, [args[1]]), vty.as_pointer())
        mask = (1 << (bits - 1)) - 1
        vec = builder.and_(builder.load(ptr, align=bits // 8), ir.Constant(vty, [mask] * n))
        fnty = ir.FunctionType(lane, [vty])
        reduce = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.vector.reduce.umax.v{n}i{bits}")
        result = builder.call(reduce, [vec])
        return result if bits == 32 else builder.zext(result, ir.IntType(32))

    return sig, codegen
