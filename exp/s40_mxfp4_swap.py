"""Issue 45, session 40: the MXFP4 grouped matmul forward with the decoded weights as wgmma's A operand in registers
("swap AB"), against `_mxfp4.mxfp4_gmm` (decoded into shared memory as wgmma's B) at the bench's MoE shape.

`outᵀ [N, M] = W [N, K] · lhsᵀ`: each compute warpgroup owns 64 weight rows (output columns) of a 128-column tile and
multiplies them by the span's `block_m` lhs rows (wgmma's N, up to 256) straight from the ring slot. A warpgroup
decodes only its own rows, in registers (no decoded tile in shared memory, no barrier between the warpgroups), and
step s + 1's decode runs while step s's wgmma does. Per 64-wide step a CTA reads 64 KB of shared memory for its
products (both warpgroups read the same lhs tile) against the shared-tile kernel's 96 KB plus 16 KB of decoded
stores. The `[64, block_m]` float32 tile is stored transposed into the warpgroup's untiled `[block_m, 64]` output
tile, whose span rows go out by TMA (`store_rows`).

Codes reach wgmma's register layout without a table: a warpgroup's `[64, 32]` code bytes are loaded 4 bytes a thread
(`WGMMA_8BIT`), which is, nibble for nibble, the 4-bit `WGMMA_UPCAST_4X` layout of `[64, 64]` codes; Mosaic GPU's
4-bit relayout (two shuffles) gives each thread the code byte of each of its bf16 pairs, and two such bytes become two
words by `_mxfp4._WORDS_PTX`.

    python exp/s40_mxfp4_swap.py --out $OUT [--tiles 256x128x4,256x128x4l]   (l: `lag`)
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, vector
from s39_mxfp4 import moe_case, report

from ejkernel.kernels._common.code_bits import as_bytes, pow2
from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu._stores import store_rows
from ejkernel.kernels._pallas.gpu.grouped_matmul._kernel import (
    COMPUTE_WGS,
    ForwardWalk,
    Ring,
    compute_units,
    forward_schedule,
    launch,
    on_compute_warpgroups,
    pad_rows,
    swizzled,
)
from ejkernel.kernels._pallas.gpu.grouped_matmul._mxfp4 import (
    GROUP,
    ROWS_LAYOUT,
    STEP,
    MosaicGpuMxfp4GroupedMatmulTiling,
    _decoded_values,
    _table_words,
    mxfp4_gmm,
    step_scales,
)
from ejkernel.modules import grouped_matmul

WG_COLS = 64  # weight rows (output columns) a compute warpgroup owns: its wgmma's M


def _factors(scales_smem, rows):
    """float32 `[rows, STEP]` (WGMMA layout): each value's group factor `2^e` (`scales_smem [STEP / GROUP, rows]`)."""
    groups = [pow2(plgpu.load(scales_smem.at[j], layout=ROWS_LAYOUT).astype(jnp.int32)) for j in range(STEP // GROUP)]
    return jnp.concatenate([lax.broadcast_in_dim(f, (rows, GROUP), [0]) for f in groups], axis=1)


def register_operand(codes_smem, scales_smem):
    """bf16 `[rows, STEP]` in the WGMMA layout (wgmma's A in registers): the step's codes `codes_smem [rows, STEP / 2]`
    decoded and scaled in PTX."""
    codes = plgpu.load(codes_smem, layout=plgpu.Layout.WGMMA_8BIT)
    rows = codes.shape[0]
    factor = _factors(scales_smem, rows)

    @plgpu.inline_mgpu(
        arg_types=(plgpu.Layout.WGMMA_8BIT, plgpu.Layout.WGMMA),
        return_type=plgpu.ShapeDtypeStruct((rows, STEP), jnp.bfloat16, layout=plgpu.Layout.WGMMA),
    )
    def assemble(_, codes, factor):
        i4, i8, i16, i32 = (ir.IntegerType.get_signless(b) for b in (4, 8, 16, 32))
        as_nibbles = lambda r: mgpu.utils.bitcast(r, ir.VectorType.get((8,), i4))
        nibbles = mgpu.FragmentedArray(
            _registers=np.vectorize(as_nibbles, otypes=[object])(codes.registers),
            _layout=fa.WGMMA_LAYOUT_UPCAST_4X,
            _is_signed=False,
        ).to_layout(mgpu.WGMMA_LAYOUT)
        pairs = nibbles.registers  # a code byte each: the two codes of one bf16 pair of the A tile
        out = np.empty(pairs.shape, dtype=object)
        bf16_pair = ir.VectorType.get((2,), ir.BF16Type.get())
        for idx in np.ndindex(pairs.shape):
            if idx[1] % 2:
                continue
            both = (idx, (idx[0], idx[1] + 1, *idx[2:]))  # 8-column blocks 2t, 2t + 1: one scale group
            low, high = (arith.extui(i32, mgpu.utils.bitcast(pairs[p], i8)) for p in both)
            word = arith.ori(low, arith.shli(high, arith.constant(i32, 8)))
            scale = vector.extract(
                factor.registers[idx], dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([0])
            )
            words = _table_words(word, scale)
            for w, p in enumerate(both):
                one = vector.extract(words, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([w]))
                out[p] = mgpu.utils.bitcast(one, bf16_pair)
        del i16
        return mgpu.FragmentedArray(_registers=out, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

    return assemble(codes, factor)


def mxfp4_gmm_swapped(
    lhs, codes, scales, group_sizes, group_offset, *, out_dtype, tiling, in_ptx: bool = True, lag: bool = False
):
    """`_mxfp4.mxfp4_gmm` with the decoded weights as wgmma's A operand in registers (block_n = 128, block_m <= 256).
    `lag`: each step's wgmma is issued behind the previous one's, which is then awaited (`wgmma_wait(1)`), in place of
    awaiting each step's wgmma before the next is issued."""
    m, k = lhs.shape
    num_local, n = codes.shape[:2]
    t = tiling
    bm, bn, stages = t.block_m, t.block_n, t.stages
    assert bn == COMPUTE_WGS * WG_COLS and bm <= 256 and k % STEP == 0 and n % bn == 0
    x = pad_rows(lhs, bm)
    col_tiles, k_steps = n // bn, k // STEP
    schedule, row_units = forward_schedule(group_sizes, group_offset, num_local, m, bm, spans=True)
    num_units = row_units * col_tiles
    num_ctas = min(t.num_ctas, num_units)

    def body(*refs):
        schedule_refs, (lhs_ref, codes_ref, scales_ref, out_ref, smem, barriers) = (
            refs[: len(schedule)],
            refs[len(schedule) :],
        )
        a_smem, c_smem, s_smem, o_smem = smem
        walk = ForwardWalk.start(
            t, schedule_refs, barriers, num_units=num_units, num_ctas=num_ctas, col_tiles=col_tiles, k_steps=k_steps
        )

        def copies(row0, col, g, kk):
            cols, ks = pl.ds(col * bn, bn), pl.ds(kk * STEP, STEP)
            return [
                (lhs_ref.at[pl.ds(row0, bm), ks], lambda slot: a_smem.at[slot]),
                (codes_ref.at[g, cols, pl.ds(kk * (STEP // 2), STEP // 2)], lambda slot: c_smem.at[slot]),
                (scales_ref.at[g, pl.ds(kk * (STEP // GROUP), STEP // GROUP), cols], lambda slot: s_smem.at[slot]),
            ]

        walk.feed(copies)

        @on_compute_warpgroups
        def _():
            wg = lax.axis_index("wg")
            ring, spans = walk.ring, walk.schedule
            mine = pl.ds(wg * WG_COLS, WG_COLS)

            def decode(step):
                slot = ring.slot(step)
                plgpu.barrier_wait(ring.ready_at(slot))
                codes, scales = c_smem.at[slot, mine], s_smem.at[slot, :, mine]
                return register_operand(codes, scales) if in_ptx else _decoded_values(codes, scales, lhs.dtype)

            def product(step0):
                def scope(acc_ref):
                    def step(s, operand, decode_next: bool):
                        """Step s's wgmma issued; after its wait, step s + 1 decoded while it runs."""
                        slot = ring.slot(step0 + s)
                        plgpu.wgmma(acc_ref, operand, a_smem.at[slot].transpose((1, 0)))
                        following = decode(step0 + s + 1) if decode_next else None
                        plgpu.wgmma_wait(0)
                        if decode_next:  # step s's registers stay live (unreused by the decode) until its wgmma is done
                            _, following = lax.optimization_barrier((operand, following))
                        plgpu.barrier_arrive(ring.consumed.at[slot])
                        return following

                    def lagged(s, operands):
                        """Step s's wgmma issued behind step s - 1's; once step s - 1's is done (its registers
                        kept live until then), its slot is freed and step s + 1 decoded while step s's runs."""
                        previous, operand = operands
                        plgpu.wgmma(acc_ref, operand, a_smem.at[ring.slot(step0 + s)].transpose((1, 0)))
                        plgpu.wgmma_wait(1)
                        previous, operand = lax.optimization_barrier((previous, operand))
                        plgpu.barrier_arrive(ring.consumed.at[ring.slot(step0 + s - 1)])
                        return operand, decode(step0 + s + 1)

                    if lag and k_steps > 1:
                        first = decode(step0)
                        plgpu.wgmma(acc_ref, first, a_smem.at[ring.slot(step0)].transpose((1, 0)))
                        operands = (first, decode(step0 + 1))
                        _, last = lax.fori_loop(1, k_steps - 1, lagged, operands)
                        plgpu.wgmma(acc_ref, last, a_smem.at[ring.slot(step0 + k_steps - 1)].transpose((1, 0)))
                        plgpu.wgmma_wait(0)
                        for s in (k_steps - 2, k_steps - 1):
                            plgpu.barrier_arrive(ring.consumed.at[ring.slot(step0 + s)])
                    else:
                        last = lax.fori_loop(0, k_steps - 1, lambda s, op: step(s, op, True), decode(step0))
                        step(k_steps - 1, last, False)
                    return acc_ref[...]

                return pl.run_scoped(scope, plgpu.ACC((WG_COLS, bm), jnp.float32))

            def output_span(span, col, step):
                g, lo, hi, row0 = spans.group[span], spans.lo[span], spans.hi[span], spans.start[span]
                out_tile = o_smem.at[wg]
                dst = lambda row, rows: out_ref.at[pl.ds(row, rows), pl.ds(col * bn + wg * WG_COLS, WG_COLS)]

                def put(value_t):
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous stores have read out_tile
                    out_tile.transpose((1, 0))[...] = value_t
                    plgpu.commit_smem()
                    store_rows(out_tile, dst, row0, lo, hi)

                pl.when(g >= 0)(lambda: put(product(step).astype(out_dtype)))
                zeros = lambda: plgpu.layout_cast(jnp.zeros((WG_COLS, bm), out_dtype), plgpu.Layout.WGMMA)
                pl.when(g < 0)(lambda: put(zeros()))

            compute_units(walk.my_units, walk.unit_of, lambda span: spans.steps(span, k_steps), output_span, False)

    scratch = (
        (
            swizzled((stages, bm, STEP), lhs.dtype),
            swizzled((stages, bn, STEP // 2), jnp.uint8),
            plgpu.SMEM((stages, STEP // GROUP, bn), jnp.uint8),
            plgpu.SMEM((COMPUTE_WGS, bm, WG_COLS), out_dtype),
        ),
        Ring.barriers(t, 3),  # per step: the lhs rows, the codes, the scales
    )
    out_type = jax.ShapeDtypeStruct((m, n), out_dtype)
    return launch(body, out_type, scratch, num_ctas, *schedule, x, codes, step_scales(scales))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="32768,4096,1536,64")
    p.add_argument("--tiles", default="256x128x4,256x128x3,128x128x4")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="out")
    args = p.parse_args()
    lhs, w, sizes, q = moe_case(args.shape)
    codes = as_bytes(q.data)
    dense = q.dequantize().astype(jnp.bfloat16)
    out = dict(preferred_element_type=jnp.bfloat16)
    ref = jax.jit(lambda a: grouped_matmul(a, dense, sizes, transpose_rhs=True, platform="xla", **out))(lhs)
    shared = MosaicGpuMxfp4GroupedMatmulTiling(256, 128, 3, num_sms())
    calls = {
        "bf16 auto": jax.jit(lambda a: grouped_matmul(a, w, sizes, **out)),
        "shared 256x128x3": jax.jit(
            lambda a: mxfp4_gmm(a, codes, q.scales, sizes, None, out_dtype=jnp.bfloat16, tiling=shared)
        ),
    }
    for spec in args.tiles.split(","):
        bm, bn, stages = map(int, spec.rstrip("l").split("x"))
        tiling = MosaicGpuMxfp4GroupedMatmulTiling(bm, bn, stages, num_sms())
        fn = jax.jit(
            functools.partial(
                mxfp4_gmm_swapped,
                codes=codes,
                scales=q.scales,
                group_sizes=sizes,
                group_offset=None,
                out_dtype=jnp.bfloat16,
                tiling=tiling,
                lag=spec.endswith("l"),
            )
        )
        try:
            got = fn(lhs).block_until_ready()
        except Exception as err:  # a tiling that does not compile: reported, the others timed
            print(f"swapped {spec}: {type(err).__name__}: {str(err)[:1500]}", flush=True)
            continue
        diff = jnp.abs(got.astype(jnp.float32) - ref.astype(jnp.float32))
        rel = float(jnp.max(diff) / jnp.max(jnp.abs(ref.astype(jnp.float32))))
        print(f"swapped {spec}: max |out - xla| / max |xla| = {rel:.3e}", flush=True)
        calls[f"swapped {spec}"] = fn
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, "s40_mxfp4_swap")


if __name__ == "__main__":
    main()
