"""Session 54: the gated delta rule's decode step with a Mosaic GPU writers' kernel (issue 44: the Triton step runs at
0.78-0.80 of copy bandwidth against a 0.8 target, while a Triton kernel that only loads and stores the same tiles
reached 0.91: each program's load, two column sums and store run in turn, their latency not hidden).

The readers' kernel is the landed Triton one (it decides each request's mode in a decode batch); the writers' kernel is
persistent: a CTA walks items `(request, head, tile of 64 value columns)` strided by the grid, its memory warpgroup
copying each item's `[Dk, 64]` float32 state tile and its q, k, v rows by TMA into a ring of shared-memory slots ahead
of `compute_wgs` compute warpgroups (item j to warpgroup j mod compute_wgs), which step the tile in registers and store
it back in place (and the output row) by TMA. The column sums reduce across warps through shared memory: `jnp.sum`
lowers to Mosaic GPU's one reduction scratch buffer, which two warpgroups would share (session 54's call 1 with two
had outputs off by 5x their size; call 2 with one was right at 0.687 of copy), so with two each reduces through a
buffer of its own (`_sums`, Mosaic GPU's own reduction given that buffer). The pool and the output are updated in
place (`jax.new_ref`).

    PYTHONPATH=src:tests python exp/s54_gdr_mosaic.py --check     # interpret mode on a CPU, against the Triton step
    PYTHONPATH=src python exp/s54_gdr_mosaic.py                   # on an H200: both steps timed, and a copy
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from _kit import check_or_bench
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.experimental.pallas import triton as pltriton

from ejkernel.kernels._common.linear_attention.inputs import L2_EPS
from ejkernel.kernels._common.vma import out_struct
from ejkernel.kernels._pallas.gpu.flash_attention._parts import along_cols, along_rows
from ejkernel.kernels._triton.ragged_gated_delta_rule import _decode as triton_decode

F32 = jnp.float32
BV = 64  # value columns an item
COPIES = 4  # TMA loads an item: its state tile, q, k and v rows
SCRATCH = 512  # float32 words of a warpgroup's reduction buffer (Mosaic GPU's default: 2 KiB)


def _sums(x, scratch):
    """`x [Dk, BV]` (WGMMA layout) summed over its rows -> `[BV]`; or `x [Dk]` (row layout) summed -> its total in
    every row. Across warps through `scratch` (`[SCRATCH]` float32 of this warpgroup's own); None: `jnp.sum` (the
    interpreter's path: it runs neither layouts nor inline Mosaic GPU)."""
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


WGMMA, ROW, COL = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)


def writers(
    q,
    k,
    v,
    beta,
    decay,
    pool,
    out,
    token,
    slot,
    mode,
    *,
    l2norm: bool,
    stages: int,
    ctas: int,
    compute_wgs: int = 2,
    interpret: bool = False,
):
    """The writers' step on `pool` and `out` in place: `(out, pool)`."""
    num_requests, heads, _ = out.shape
    dk, num_slots, tiles = q.shape[-1], pool.shape[0], v.shape[-1] // BV
    items = num_requests * heads * tiles
    scale = dk**-0.5
    has_decay = decay is not None

    def body(*refs):
        token_ref, slot_ref, mode_ref, q_ref, k_ref, v_ref, beta_ref, *refs = refs
        decay_ref = refs.pop(0) if has_decay else None
        pool_ref, out_ref, (h_smem, q_smem, k_smem, v_smem, o_smem, scratch), (ready, consumed) = refs
        cta, wg = lax.axis_index("ctas"), lax.axis_index("wg")
        count = lax.div(jnp.int32(items) - cta + (ctas - 1), jnp.int32(ctas))

        def item(j):
            i = cta + j * ctas
            r, rest = lax.div(i, jnp.int32(heads * tiles)), lax.rem(i, jnp.int32(heads * tiles))
            h, t = lax.div(rest, jnp.int32(tiles)), lax.rem(rest, jnp.int32(tiles))
            return r, h, pl.ds(pl.multiple_of(t * BV, BV), BV), jnp.clip(slot_ref[r], 0, num_slots - 1)

        def feed():
            @pl.loop(0, count)
            def _(j):
                s = lax.rem(j, jnp.int32(stages))
                r, h, cols, pool_slot = item(j)
                tok, writes = token_ref[r], mode_ref[r] == triton_decode.WRITES
                pl.when(j >= stages)(lambda: plgpu.barrier_wait(consumed.at[s]))

                @pl.when(writes)
                def _():
                    plgpu.copy_gmem_to_smem(pool_ref.at[pool_slot, h, :, cols], h_smem.at[s], ready.at[s])
                    plgpu.copy_gmem_to_smem(q_ref.at[tok, h], q_smem.at[s], ready.at[s])
                    plgpu.copy_gmem_to_smem(k_ref.at[tok, h], k_smem.at[s], ready.at[s])
                    plgpu.copy_gmem_to_smem(v_ref.at[tok, h, cols], v_smem.at[s], ready.at[s])

                @pl.when(jnp.logical_not(writes))  # a reader (its slot is its writer's) or idle: nothing to load
                def _():
                    for _ in range(COPIES):
                        plgpu.barrier_arrive(ready.at[s])

        @pl.when(wg == compute_wgs)
        def _():
            plgpu.set_max_registers(40, action="decrease")
            feed()

        @pl.when(wg < compute_wgs)
        def _():
            plgpu.set_max_registers(232, action="increase")
            own = None if interpret else scratch.at[wg]

            @pl.loop(0, lax.div(count - wg + (compute_wgs - 1), jnp.int32(compute_wgs)))
            def _(n):
                j = compute_wgs * n + wg
                s = lax.rem(j, jnp.int32(stages))
                r, h, cols, pool_slot = item(j)
                tok, m = token_ref[r], mode_ref[r]
                plgpu.barrier_wait(ready.at[s])

                @pl.when(m == triton_decode.WRITES)
                def _():
                    gate = beta_ref[tok, h].astype(F32)
                    qv = plgpu.load(q_smem.at[s], layout=ROW).astype(F32)
                    kv = plgpu.load(k_smem.at[s], layout=ROW).astype(F32)
                    if l2norm:
                        qv = qv * lax.rsqrt(_sums(qv * qv, own) + L2_EPS)
                        kv = kv * lax.rsqrt(_sums(kv * kv, own) + L2_EPS)
                    state = plgpu.load(h_smem.at[s], layout=WGMMA)
                    if has_decay:
                        state = state * jnp.exp(decay_ref[tok, h].astype(F32))
                    k_rows = along_rows(kv, state.shape)
                    vv = plgpu.load(v_smem.at[s], layout=COL).astype(F32)
                    u = gate * (vv - _sums(state * k_rows, own))
                    state = state + k_rows * along_cols(u, state.shape)
                    o = _sums(along_rows(qv * scale, state.shape) * state, own)
                    h_smem.at[s][...] = state
                    o_smem.at[s][...] = o.astype(o_smem.dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(h_smem.at[s], pool_ref.at[pool_slot, h, :, cols])
                    plgpu.copy_smem_to_gmem(o_smem.at[s], out_ref.at[r, h, cols])

                @pl.when(m == triton_decode.IDLE)
                def _():
                    o_smem.at[s][...] = plgpu.layout_cast(jnp.zeros((BV,), F32), COL).astype(o_smem.dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(o_smem.at[s], out_ref.at[r, h, cols])

                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the slot is read out: refill it
                plgpu.barrier_arrive(consumed.at[s])

            plgpu.wait_smem_to_gmem(0)

    scratch = (
        (
            # swizzled (rows of 32 float32, 128 bytes): plain rows of 64 would put a warp's 8 rows in one bank set
            plgpu.SMEM((stages, dk, BV), F32, transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))),
            plgpu.SMEM((stages, dk), q.dtype),
            plgpu.SMEM((stages, dk), k.dtype),
            plgpu.SMEM((stages, BV), v.dtype),
            plgpu.SMEM((stages, BV), out.dtype),
            plgpu.SMEM((compute_wgs, SCRATCH), F32),
        ),
        (plgpu.Barrier(num_arrivals=COPIES, num_barriers=stages), plgpu.Barrier(num_arrivals=1, num_barriers=stages)),
    )
    pool_ref, out_ref = jax.new_ref(pool), jax.new_ref(out)
    args = [token, slot, mode, q, k, v, beta] + ([decay] if has_decay else []) + [pool_ref, out_ref]
    plgpu.kernel(
        body,
        out_type=(),
        scratch_types=scratch,
        grid=(ctas,),
        grid_names=("ctas",),
        num_threads=compute_wgs + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
    )(*args)
    return jax.freeze(out_ref), jax.freeze(pool_ref)


def readers(query, key, value, beta, decay, pool, state_indices, *, interpret=False):
    """The landed Triton readers' kernel of a decode batch (token r is request r): `(out, token, slot, mode)`."""
    num_requests, heads, dv = state_indices.shape[0], query.shape[1], value.shape[-1]
    token = jnp.arange(num_requests, dtype=jnp.int32)
    slot = state_indices.astype(jnp.int32)
    tokens = [query, key, value, beta] + ([] if decay is None else [decay])
    static = dict(block_v=BV, l2norm=True, scale=query.shape[-1] ** -0.5, has_decay=decay is not None)
    call = pl.pallas_call(
        functools.partial(triton_decode._readers_kernel, heads=heads, tiles=dv // BV, modes_given=False, **static),
        grid=(num_requests,),
        out_shape=[
            out_struct((num_requests, heads, dv), query.dtype, token, slot, *tokens, pool),
            out_struct((num_requests,), jnp.int32, token, slot, *tokens, pool),
        ],
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ejkernel_ragged_delta_decode_readers",
    )
    out, mode = call(token, slot, *tokens, pool)
    return out, token, slot, mode


def decode_batch(query, key, value, beta, decay, pool, state_indices, *, stages=4, ctas=132, compute_wgs=2):
    """A decode batch as `ragged_gated_delta_rule` without `query_start_loc`: the Triton readers' kernel, then the
    Mosaic GPU writers'. `(out, new pool)`."""
    out, token, slot, mode = readers(query, key, value, beta, decay, pool, state_indices)
    options = dict(l2norm=True, stages=stages, ctas=ctas, compute_wgs=compute_wgs)
    return writers(query, key, value, beta, decay, pool, out, token, slot, mode, **options)


def inputs(num_requests: int, heads: int, dk: int, dv: int, num_slots: int, seed: int = 0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = jax.random.normal(keys[0], (num_requests, heads, dk), jnp.bfloat16)
    k = jax.random.normal(keys[1], (num_requests, heads, dk), jnp.bfloat16)
    v = jax.random.normal(keys[2], (num_requests, heads, dv), jnp.bfloat16)
    beta = jax.nn.sigmoid(jax.random.normal(keys[3], (num_requests, heads), F32)).astype(jnp.bfloat16)
    decay = -jax.nn.softplus(jax.random.normal(keys[4], (num_requests, heads), F32))
    pool = jax.random.normal(keys[5], (num_slots, heads, dk, dv), F32)
    slots = jax.random.permutation(keys[6], num_slots)[:num_requests].astype(jnp.int32)
    return q, k, v, beta, decay, pool, slots


def triton_step(q, k, v, beta, decay, pool, slots, interpret=False):
    from ejkernel.kernels._triton.ragged_gated_delta_rule._interface import ragged_gated_delta_rule_triton

    return ragged_gated_delta_rule_triton(q, k, v, beta, decay, pool, None, slots, interpret=interpret)


def check() -> None:
    """Interpret mode: the Mosaic GPU step against the Triton one (interpreted too), with a reader, an idle
    request and both tiles of 128 value columns."""
    from mosaic_gpu_interpret import interpret_mode

    q, k, v, beta, decay, pool, slots = inputs(5, 2, 64, 128, 8)
    slots = slots.at[3].set(slots[1]).at[4].set(-1)  # request 3 reads request 1's slot; request 4 is idle
    want_out, want_pool = triton_step(q, k, v, beta, decay, pool, slots, interpret=True)
    out, token, slot, mode = readers(q, k, v, beta, decay, pool, slots, interpret=True)
    with interpret_mode():
        options = dict(l2norm=True, stages=2, ctas=3, interpret=True)
        out, new_pool = writers(q, k, v, beta, decay, pool, out, token, slot, mode, **options)
    for name, a, b in (("out", out, want_out), ("pool", new_pool, want_pool)):
        err = float(jnp.max(jnp.abs(a.astype(F32) - b.astype(F32))) / jnp.max(jnp.abs(b.astype(F32))))
        print(f"{name}: max error {err:.2e} of max")
        assert err < 2e-2, name


def bench(repeats: int) -> None:
    from ejkernel.benchmarks._harness import copy_bandwidth
    from ejkernel.ops.autotune import time_fns

    num_requests, heads, d = 256, 32, 128
    q, k, v, beta, decay, pool, slots = inputs(num_requests, heads, d, d, 2 * num_requests)
    moved = num_requests * heads * d * d * 4 * 2 + 4 * num_requests * heads * d * 2
    steps = {"triton": jax.jit(triton_step, donate_argnums=5)}
    ctas = getattr(jax.devices()[0], "core_count", 132)  # one CTA an SM (its compute warpgroups hold the registers)
    for stages, compute_wgs in ((4, 2), (6, 2), (4, 1)):
        step = functools.partial(decode_batch, stages=stages, ctas=ctas, compute_wgs=compute_wgs)
        steps[f"mosaic s{stages} wg{compute_wgs}"] = jax.jit(step, donate_argnums=5)
    pools = {name: pool + 0 for name in steps}
    results = {}
    for name, step in steps.items():
        results[name] = step(q, k, v, beta, decay, pools[name], slots)
        pools[name] = results[name][1]
    for name in steps:
        errors = [
            float(jnp.max(jnp.abs(x.astype(F32) - ref.astype(F32))) / jnp.max(jnp.abs(ref.astype(F32))))
            for x, ref in zip(results[name], results["triton"], strict=True)
        ]
        print(f"{name}: out / pool max error {errors[0]:.2e} / {errors[1]:.2e} of max against Triton")

    def run(name):
        out, pools[name] = steps[name](q, k, v, beta, decay, pools[name], slots)
        return out

    times = time_fns({name: functools.partial(run, name) for name in steps}, repeats=repeats)
    copy = copy_bandwidth(quick=False, repeats=repeats)
    for name, seconds in times.items():
        rate = moved / seconds
        print(f"{name}: {1e3 * seconds:.4f} ms, {rate / 1e12:.2f} TB/s, {rate / copy:.3f} of copy")
    print(f"copy {copy / 1e12:.2f} TB/s")


if __name__ == "__main__":
    check_or_bench(__doc__, check, bench)
