"""The gated delta rule's decode step on the state pool in place, in persistent Mosaic GPU kernels (Hopper).

Work comes in items `(request, head, tile of block_v value columns)` (64; 128 for a 16-bit pool where they fit). Each
CTA walks its items, its memory warpgroup copying an item's `[Dk, block_v]` state tile and its q, k, v rows by TMA into
a ring of shared-memory slots ahead of the compute warpgroups (item j to warpgroup `j mod compute_wgs`), which step the
tile in float32 registers (`h ← h·e^{decay}`, `u = β (v − hᵀk)`, `h ← h + k uᵀ`, `o = scale · qᵀh`) and store the output
row, and in the writers' pass the tile (rounded to the pool's dtype: float32, bfloat16 or float16), by TMA. The column
sums reduce across warps through shared memory: `jnp.sum` would lower to Mosaic GPU's one reduction buffer for the whole
kernel, which two warpgroups would share (wrong outputs on an H200, session 54), so each warpgroup reduces through a
buffer of its own (`_sums`).

Modes are the XLA implementation's (`_common.linear_attention.ragged`): a request `WRITES` (the first live request
of its slot), `READS` (live, but an earlier request writes its slot: output only, from the old state) or is `IDLE`
(empty, or its slot outside the pool: it outputs nothing, its row stays zero). Readers must see the old state, so the
readers' pass runs first (its CTAs walk requests, stepping only readers' items: a launch when there is none); the
writers' pass then walks every item, loading and stepping writers' tiles only. Request r reads its token `token[r]`
where it lies (a decode batch's r, or a request's first token within bounds) and writes its output row there, so a
call with request bounds needs no gather or scatter around the kernels. The output (zeros first) and the pool are
updated in place (`jax.new_ref`).

On an H200 (256 requests, H 32, D 128; session 55, `ejkernel bench linear_attention --part serving`, four runs): a
decode batch on a float32 pool 0.300-0.307 ms, 0.84-0.90 of the device copy's bandwidth, against 0.328-0.333 ms
(0.78-0.83) for the Triton step in the same runs (the writers' pass 280-286 us, the XLA modes and the readers' pass 5);
with request bounds 0.334 ms (0.77; Triton 0.368, 0.70), the `lax.cond`'s predicate read on the host most of the
difference; on a bf16 pool with 64-column items 0.219-0.225 ms, as Triton (0.59: half the bytes, the same steps),
with 128-column items 0.190 ms (0.69). One compute warpgroup instead of two: 0.69 (session 54).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from ejkernel.kernels._common.linear_attention.inputs import L2_EPS
from ejkernel.kernels._common.linear_attention.ragged import (
    READS,
    WRITES,
    Requests,
    decode_modes,
    decode_token,
    first_writers,
    in_pool,
)
from ejkernel.kernels._pallas.gpu.flash_attention._parts import along_cols, along_rows

F32 = jnp.float32
BLOCK_V = 64  # value columns an item of a float32 pool (a ring of 128-column float32 tiles overflows shared memory)
COPIES = 4  # TMA loads an item: its state tile, q, k and v rows
SCRATCH = 512  # float32 words of a warpgroup's reduction buffer (Mosaic GPU's default size: 2 KiB)
MEMORY_REGISTERS, COMPUTE_REGISTERS = 40, 232
WGMMA, ROW, COL = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)


@dataclasses.dataclass(frozen=True)
class MosaicGpuRaggedDecodeTiling:
    """Value columns an item (`for_pool`), ring slots (a multiple of the compute warpgroups, so that each slot stays
    one warpgroup's: barrier phases are per thread; 4 and 6 measured alike), compute warpgroups (2: one reached 0.69
    of copy, two 0.84; three over 6 slots 0.835 on a float32 pool, 0.67 on bf16 against 0.60), CTAs (None: one per
    SM), interpret mode."""

    block_v: int = BLOCK_V
    stages: int = 4
    compute_wgs: int = 2
    ctas: int | None = None
    interpret: bool = False

    @classmethod
    def for_pool(cls, pool_dtype, dim_v: int, **fields) -> MosaicGpuRaggedDecodeTiling:
        """16-bit pools take items of 128 columns where `dim_v` allows: the same bytes an item as float32's 64, the
        same steps for twice the columns (session 55 on an H200, a bf16 pool: 0.190 ms against 0.219 with 64)."""
        wide = jnp.dtype(pool_dtype).itemsize == 2 and dim_v % (2 * BLOCK_V) == 0
        return cls(block_v=2 * BLOCK_V if wide else BLOCK_V, **fields)


def _sums(x, scratch):
    """`x [Dk, block_v]` (WGMMA layout) summed over its rows -> `[block_v]`, or `x [Dk]` (row layout) summed -> its
    total in every row; across warps through `scratch` (this warpgroup's `[SCRATCH]` float32). None: `jnp.sum` (for
    the interpreter, which runs neither layouts nor inline Mosaic GPU)."""
    if scratch is None:
        total = jnp.sum(x, axis=0)
        return total if x.ndim == 2 else jnp.broadcast_to(total, x.shape)
    if x.ndim == 2:
        ret, layout = plgpu.ShapeDtypeStruct((x.shape[1],), x.dtype, layout=COL), WGMMA

        def body(_, a, buffer):
            return a.reduce("add", 0, scratch=buffer)

    else:
        ret, layout = plgpu.ShapeDtypeStruct(x.shape, x.dtype, layout=ROW), ROW

        def body(_, a, buffer):
            total = a.reduce("add", 0, scratch=buffer)
            return mgpu.FragmentedArray.splat(total.registers.flat[0], a.shape, a.layout, is_signed=None)

    return plgpu.inline_mgpu(arg_types=(layout, plgpu.RefType()), return_type=ret)(body)(x, scratch)


def modes(slots, num_slots: int):
    """`[N]` int32: each request of a decode batch's `decode_modes` (every request has its one token)."""
    writes = first_writers(slots, jnp.ones(slots.shape, bool), num_slots)
    return decode_modes(writes, in_pool(slots, num_slots))


def _pass(tiling, l2norm: bool, writers: bool, q, k, v, beta, decay, pool, out_ref, slot, mode, token):
    """One pass over the items, request r's token `token[r]`: the readers' (`writers` False) or the writers' (`pool`
    updated in place, a ref). Each writes its requests' output rows into `out_ref` in place."""
    num_requests, (_, heads, dk) = slot.shape[0], q.shape
    num_slots, cw, stages, block_v = pool.shape[0], tiling.compute_wgs, tiling.stages, tiling.block_v
    tiles = v.shape[-1] // block_v
    ctas = tiling.ctas or getattr(jax.devices()[0], "core_count", 132)
    per_request = heads * tiles
    has_decay = decay is not None

    def body(*refs):
        slot_ref, mode_ref, token_ref, q_ref, k_ref, v_ref, beta_ref, *refs = refs
        decay_ref = refs.pop(0) if has_decay else None
        pool_ref, out_ref, (h_smem, q_smem, k_smem, v_smem, o_smem, scratch), (ready, consumed) = refs
        cta, wg = lax.axis_index("ctas"), lax.axis_index("wg")

        def walk(visit):
            """`visit(j, r, h, cols)` for this CTA's items in order, j counting them: every item of the requests
            strided by the grid (writers), or every item of those requests that read (readers)."""
            if writers:
                count = lax.div(jnp.int32(num_requests * per_request) - cta + (ctas - 1), jnp.int32(ctas))

                @pl.loop(0, count)
                def _(j):
                    i = cta + j * ctas
                    r, rest = lax.div(i, jnp.int32(per_request)), lax.rem(i, jnp.int32(per_request))
                    visit(j, r, lax.div(rest, jnp.int32(tiles)), lax.rem(rest, jnp.int32(tiles)))

                return

            def request(n, j0):
                r = cta + n * ctas
                steps = jnp.where(mode_ref[r] == READS, per_request, 0)

                def item(i, j):
                    visit(j, r, lax.div(i, jnp.int32(tiles)), lax.rem(i, jnp.int32(tiles)))
                    return j + 1

                return lax.fori_loop(0, steps, item, j0)

            lax.fori_loop(0, lax.div(num_requests - cta + (ctas - 1), jnp.int32(ctas)), request, jnp.int32(0))

        def item_mode(r):
            return mode_ref[r] if writers else jnp.int32(READS)

        def feed(j, r, h, t):
            s = lax.rem(j, jnp.int32(stages))
            cols = pl.ds(pl.multiple_of(t * block_v, block_v), block_v)
            loads = item_mode(r) == (WRITES if writers else READS)
            pl.when(j >= stages)(lambda: plgpu.barrier_wait(consumed.at[s]))

            @pl.when(loads)
            def _():
                pool_slot, row = jnp.clip(slot_ref[r], 0, num_slots - 1), token_ref[r]
                plgpu.copy_gmem_to_smem(pool_ref.at[pool_slot, h, :, cols], h_smem.at[s], ready.at[s])
                plgpu.copy_gmem_to_smem(q_ref.at[row, h], q_smem.at[s], ready.at[s])
                plgpu.copy_gmem_to_smem(k_ref.at[row, h], k_smem.at[s], ready.at[s])
                plgpu.copy_gmem_to_smem(v_ref.at[row, h, cols], v_smem.at[s], ready.at[s])

            @pl.when(jnp.logical_not(loads))  # nothing to load: the slot's turn passes
            def _():
                for _ in range(COPIES):
                    plgpu.barrier_arrive(ready.at[s])

        def step(own, j, r, h, t):
            """Warpgroup `j mod compute_wgs`'s item: the tile stepped, the output row (and the tile) stored."""
            s = lax.rem(j, jnp.int32(stages))
            cols = pl.ds(pl.multiple_of(t * block_v, block_v), block_v)
            m, row = item_mode(r), token_ref[r]
            plgpu.barrier_wait(ready.at[s])

            @pl.when(m == (WRITES if writers else READS))
            def _():
                qv = plgpu.load(q_smem.at[s], layout=ROW).astype(F32)
                kv = plgpu.load(k_smem.at[s], layout=ROW).astype(F32)
                if l2norm:
                    qv = qv * lax.rsqrt(_sums(qv * qv, own) + L2_EPS)
                    kv = kv * lax.rsqrt(_sums(kv * kv, own) + L2_EPS)
                state = plgpu.load(h_smem.at[s], layout=WGMMA).astype(F32)
                if has_decay:
                    state = state * jnp.exp(decay_ref[row, h].astype(F32))
                k_rows = along_rows(kv, state.shape)
                vv = plgpu.load(v_smem.at[s], layout=COL).astype(F32)
                u = beta_ref[row, h].astype(F32) * (vv - _sums(state * k_rows, own))
                state = state + k_rows * along_cols(u, state.shape)
                o_smem.at[s][...] = _sums(along_rows(qv * dk**-0.5, state.shape) * state, own).astype(o_smem.dtype)
                if writers:
                    h_smem.at[s][...] = state.astype(h_smem.dtype)
                plgpu.commit_smem()
                if writers:
                    pool_slot = jnp.clip(slot_ref[r], 0, num_slots - 1)
                    plgpu.copy_smem_to_gmem(h_smem.at[s], pool_ref.at[pool_slot, h, :, cols])
                plgpu.copy_smem_to_gmem(o_smem.at[s], out_ref.at[row, h, cols])

            plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slot is read out: it may be refilled
            plgpu.barrier_arrive(consumed.at[s])

        @pl.when(wg == cw)
        def _():
            plgpu.set_max_registers(MEMORY_REGISTERS, action="decrease")
            walk(feed)

        @pl.when(wg < cw)
        def _():
            plgpu.set_max_registers(COMPUTE_REGISTERS, action="increase")
            own = None if tiling.interpret else scratch.at[wg]

            def visit(j, r, h, t):
                pl.when(lax.rem(j, jnp.int32(cw)) == wg)(lambda: step(own, j, r, h, t))

            walk(visit)
            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            # swizzled (rows of 128 bytes): plain rows of 64 values would put a warp's 8 rows in one set of banks
            plgpu.SMEM(
                (stages, dk, block_v),
                pool.dtype,
                transforms=(plgpu.TilingTransform((8, 128 // pool.dtype.itemsize)), plgpu.SwizzleTransform(128)),
            ),
            plgpu.SMEM((stages, dk), q.dtype),
            plgpu.SMEM((stages, dk), k.dtype),
            plgpu.SMEM((stages, block_v), v.dtype),
            plgpu.SMEM((stages, block_v), out_ref.dtype),
            plgpu.SMEM((cw, SCRATCH), F32),
        ),
        (plgpu.Barrier(num_arrivals=COPIES, num_barriers=stages), plgpu.Barrier(num_arrivals=1, num_barriers=stages)),
    )
    kernel = plgpu.kernel(
        body,
        out_type=(),
        scratch_types=scratch,
        grid=(ctas,),
        grid_names=("ctas",),
        num_threads=cw + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name="ejkernel_ragged_delta_decode_" + ("writers" if writers else "readers"),
    )
    args = [slot, mode, token, q, k, v, beta] + ([decay] if has_decay else [])
    kernel(*args, pool, out_ref)


def decode_step(tiling: MosaicGpuRaggedDecodeTiling, l2norm: bool, inputs, pool, slot, mode, token):
    """Request r steps token `token[r]` (of `inputs`: query, key, value, beta, decay) on slot `slot[r]` as `mode[r]`
    says: `(out [T, H, Dv] in the query's dtype, zero in rows no request writes; the pool after the step)`, both
    written in place."""
    query, value = inputs[0], inputs[2]
    out_ref = jax.new_ref(jnp.zeros((query.shape[0], *value.shape[1:]), query.dtype))
    _pass(tiling, l2norm, False, *inputs, pool, out_ref, slot, mode, token)
    pool_ref = jax.new_ref(pool)
    _pass(tiling, l2norm, True, *inputs, pool_ref, out_ref, slot, mode, token)
    return jax.freeze(out_ref), jax.freeze(pool_ref)


def decode_batch(tiling: MosaicGpuRaggedDecodeTiling, l2norm: bool, query, key, value, beta, decay, pool, slots):
    """A decode batch (request r steps token r on slot `slots[r]`): `(out [N, H, Dv] in the query's dtype, the pool
    after the step)`, the pool updated in place."""
    slot = slots.astype(jnp.int32)
    token = jnp.arange(slot.shape[0], dtype=jnp.int32)
    return decode_step(tiling, l2norm, (query, key, value, beta, decay), pool, slot, modes(slot, pool.shape[0]), token)


def decode_requests(tiling: MosaicGpuRaggedDecodeTiling, l2norm: bool, inputs, pool, req: Requests):
    """Every request of `req` with at most one token (a decode call with request bounds): `(out [T, H, Dv], the pool
    after the step)`. Empty requests and padding tokens are left out (zero rows); the tokens are read in place."""
    token = decode_token(req.bounds, inputs[0].shape[0])
    return decode_step(tiling, l2norm, inputs, pool, req.slots, decode_modes(req.writes, req.live), token)
