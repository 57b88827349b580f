"""Numba in one place: the jit helper and the 32-bit integer intrinsics the kernels use.

Importing this module imports numba; the rest of the package imports it only when a kernel is
first needed, so ``import neuron_kernels`` stays cheap and compiles nothing.

Plain numba integer code widens ``uint32`` arithmetic to 64 bits, which halves the SIMD width
of the cast loops. The intrinsics below emit the 32-bit LLVM instruction directly; their
arguments are converted to ``uint32`` first, so literals can be passed as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "jit", "u32_add", "u32_sub", "u32_mul", "u32_shr", "u32_shl", "u32_and", "u32_or", "u32_xor",
    "f32_bits", "f32_from_bits", "i32_positive",
]

#: The options of every kernel: cached on disk, GIL released, no fastmath (it breaks NaN and
#: signed-zero handling).
JIT_OPTIONS: dict[str, Any] = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}


def jit(fn: Callable[..., Any] | None = None, **overrides: Any) -> Any:
    """``numba.njit`` with the package's options; compiles lazily on the first call."""
    options = {**JIT_OPTIONS, **overrides}
    if fn is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(fn)


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
