"""numba intrinsics for the jitted batch gather; why they exist: see native.py.

Imported only when numba's JIT is in use (jit.use_jit, or the AOT build):
kernels reach these through the names in native.py.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


@intrinsic
def copy(typingctx, dst, src, n):
    """memcpy(dst address, src address, n bytes)."""
    sig = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        p8 = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[0], p8), builder.inttoptr(args[1], p8), args[2], 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def load_i64(typingctx, addr, i):
    """The int64 at ``addr + 8*i``."""
    sig = types.int64(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        p = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load(builder.gep(p, [args[1]]))

    return sig, codegen


@intrinsic
def call_hash(typingctx, fn, addr, n):
    """``uint64 fn(const void *addr, size_t n)`` called through its address."""
    sig = types.uint64(types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        i64, p8 = ir.IntType(64), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i64, [p8, i64])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(f, [builder.inttoptr(args[1], p8), args[2]])

    return sig, codegen


@intrinsic
def call_preadv(typingctx, fn, fd, iov, count, offset):
    """``ssize_t preadv(int fd, const struct iovec *iov, int count, off_t offset)`` through its address."""
    sig = types.int64(types.intp, types.int64, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i64, i32, p8 = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i64, [i32, p8, i32, i64])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(f, [builder.trunc(args[1], i32), builder.inttoptr(args[2], p8),
                                builder.trunc(args[3], i32), args[4]])

    return sig, codegen


@intrinsic
def call_state(typingctx, fn, state):
    """``uint64 fn(void *state)`` through its address (XXH3_64bits_reset, XXH3_64bits_digest)."""
    sig = types.uint64(types.intp, types.intp)

    def codegen(context, builder, signature, args):
        i64, p8 = ir.IntType(64), ir.IntType(8).as_pointer()
        f = builder.inttoptr(args[0], ir.FunctionType(i64, [p8]).as_pointer())
        return builder.call(f, [builder.inttoptr(args[1], p8)])

    return sig, codegen


@intrinsic
def call_update(typingctx, fn, state, addr, n):
    """``int fn(void *state, const void *addr, size_t n)`` through its address (XXH3_64bits_update)."""
    sig = types.int32(types.intp, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        i64, i32, p8 = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        f = builder.inttoptr(args[0], ir.FunctionType(i32, [p8, p8, i64]).as_pointer())
        return builder.call(f, [builder.inttoptr(args[1], p8), builder.inttoptr(args[2], p8), args[3]])

    return sig, codegen
