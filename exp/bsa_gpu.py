"""GPU experiment: the Mosaic GPU block-sparse attention against the XLA path (errors), then timed beside
dense flash attention and the Triton block-sparse kernels.

Run on an H100/H200 from the repository root:

    PYTHONPATH=$PWD/src python3 exp/bsa_gpu.py [--skip-check] [--skip-bwd] [--repeats 10] [--variants TEXT]

(a) relative errors of the Mosaic forward and of every gradient against the XLA path at medium shapes:
random 128x128 blocks with query blocks that attend nothing (their rows must be exact zeros, with zero
dq), causal + sliding window + segment ids (with padding) + sinks at a padded length at head dim 64
(fused backward), soft cap + chunks with the fused backward forced at head dim 128; (b) forward and
forward+backward times at S=16384, H=16, D=128, bf16, random 128x128 blocks at 10% and 25% density
(not causal, as the sparse_attention benchmark), for dense `flash_attention` (auto), the Triton
block-sparse kernels and the Mosaic kernels at several tilings, printed at the end as ms and
time / (density x dense time) (target, issue 27: <= 1.3 forward+backward). Every case runs in its own
try/except (the first lines of an exception are printed); a watchdog names the stage and exits if
nothing progresses for --stall seconds (a kernel whose barriers deadlock hangs the GPU); compiles stop
once --budget seconds have passed.

`--cpu-smoke` runs the same steps at tiny shapes on a CPU, the Mosaic kernels in Mosaic GPU interpret
mode and without the Triton variants (timings there mean nothing): it checks this script, not the GPU.
(On a 2-core machine about one such run in ten hangs in interpret mode, its warpgroup threads starved
inside XLA's CPU runtime; the watchdog ends it. The tests retry such runs in a fresh process.)
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from _kit import elapsed, first_lines, interpret_context, log, rel, start_watchdog

from ejkernel.kernels._pallas.gpu.blocksparse_attention import _interface as mosaic_interface
from ejkernel.kernels._xla.blocksparse_attention import blocksparse_attention_xla
from ejkernel.modules import BlockSparseAttentionConfig, blocksparse_attention, flash_attention
from ejkernel.ops import BwdParams, FwdParams
from ejkernel.ops.autotune import time_fns
from ejkernel.types import MaskInfo

BLOCK = 128


def block_pattern(q_len: int, kv_len: int, density: float, seed: int, empty_rows=()):
    """(bool mask [1, 1, Sq, Sk] on the device, tile density) of a random pattern of 128x128 tiles."""
    tiles = np.random.default_rng(seed).random((-(-q_len // BLOCK), -(-kv_len // BLOCK))) < density
    tiles[list(empty_rows)] = False
    dense = np.repeat(np.repeat(tiles, BLOCK, 0), BLOCK, 1)[:q_len, :kv_len]
    return jnp.asarray(dense[None, None]), float(tiles.mean())


class Ops:
    """The implementations under test: the public op on a GPU; on a CPU (--cpu-smoke) the registered Mosaic
    function itself, in Mosaic GPU interpret mode."""

    def __init__(self, smoke: bool):
        self.smoke = smoke

    def context(self):
        """Where the whole run happens: on a CPU, Mosaic GPU interpret mode (it must last until the kernels
        have run, not only while they are traced)."""
        if self.smoke:
            mosaic_interface.is_hopper = lambda: True
        return interpret_context(self.smoke, detect_races=False)

    def mosaic(self, q, k, v, aux=None, *, cfg=None, **options):
        if self.smoke:
            params = {} if cfg is None else dict(fwd_params=cfg.fwd_params, bwd_params=cfg.bwd_params)
            return mosaic_interface.blocksparse_attention_mosaic_gpu(q, k, v, aux, **params, **options)
        cfg = cfg or BlockSparseAttentionConfig(platform="pallas")
        return blocksparse_attention(q, k, v, aux, platform="pallas", cfg=cfg, **public(options))

    def triton(self, q, k, v, **options):
        return blocksparse_attention(q, k, v, platform="triton", **public(options))


def public(options: dict) -> dict:
    """The options as the public op takes them: segment ids (which the implementations take) in a MaskInfo."""
    options = dict(options)
    segments = [options.pop(name, None) for name in ("q_segment_ids", "kv_segment_ids")]
    if segments[0] is not None:
        options["mask_info"] = MaskInfo.from_segments(*segments)
    return options


# ---- (a) errors against the XLA path ----


def check_cases(smoke: bool):
    """(name, (B, H, Hkv, Sq, Sk, D), options for both, Mosaic-only options, sinks, rows that attend nothing)."""
    if smoke:
        mask, _ = block_pattern(256, 256, 0.6, seed=1, empty_rows=(1,))
        return [
            (
                "random-blocks-empty-rows",
                (1, 2, 1, 256, 256, 128),
                dict(attention_mask=mask, causal=False),
                {},
                0,
                (1,),
            ),
            ("causal-window-sinks-d64", (1, 2, 1, 200, 200, 64), dict(causal=True, sliding_window=(90, 0)), {}, 1, ()),
        ]
    mask, _ = block_pattern(2048, 2048, 0.25, seed=1, empty_rows=(3, 9))
    cuts = np.sort(np.random.default_rng(2).choice(np.arange(1, 2900), 3, replace=False))
    segments = np.searchsorted(cuts, np.arange(3000), side="right").astype(np.int32)
    segments[2900:] = -1  # padding: rows that attend nothing
    segments = jnp.asarray(np.stack([segments, segments]))  # [B=2, S]
    return [
        (
            "random-blocks-empty-rows-d128",
            (2, 8, 2, 2048, 2048, 128),
            dict(attention_mask=mask, causal=False),
            {},
            0,
            (3, 9),
        ),
        (
            "causal-window-segments-sinks-padded-d64-fused",
            (2, 8, 4, 3000, 3000, 64),
            dict(causal=True, sliding_window=(1000, 0), q_segment_ids=segments, kv_segment_ids=segments),
            {},
            1,
            (),
        ),
        (
            "soft-cap-chunks-fused-forced-d128",
            (1, 8, 8, 2048, 2500, 128),
            dict(causal=False, chunk_size=700, logits_soft_cap=30.0),
            dict(fused_backward=True),
            0,
            (),
        ),
    ]


def check(ops: Ops, name, shape, options, mosaic_only, sinks, empty_rows):
    batch, heads, kv_heads, q_len, kv_len, dim = shape
    keys = jax.random.split(jax.random.PRNGKey(len(name)), 5)
    q = jax.random.normal(keys[0], (batch, heads, q_len, dim), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (batch, kv_heads, kv_len, dim), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (batch, kv_heads, kv_len, dim), jnp.float32).astype(jnp.bfloat16)
    aux = jax.random.normal(keys[3], (heads,), jnp.float32) if sinks else None
    dout = jax.random.normal(keys[4], (batch, heads, q_len, dim), jnp.float32).astype(jnp.bfloat16)
    st = mosaic_interface.plan(q, k, v, aux, **options, **mosaic_only)[0]
    log(
        f"check {name}: B={batch} H={heads} Hkv={kv_heads} Sq={q_len} Sk={kv_len} D={dim} sinks={bool(sinks)} "
        f"{ {n: x for n, x in options.items() if n != 'attention_mask'} } {mosaic_only}; kernels: fwd step "
        f"{st.block_k} stages {st.stages} overlap {st.overlap}, bwd {'fused' if st.fused_bwd else 'dq+dkv'} "
        f"steps {st.block_k_dq}/{st.block_q_dkv} stages {st.stages_bwd}"
    )
    argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)

    def vjp(fn, *args):
        def differentiable(*diff):
            full = list(args)
            for i, x in zip(argnums, diff, strict=True):
                full[i] = x
            return fn(*full)

        out, pullback = jax.vjp(differentiable, *[args[i] for i in argnums])
        return out, pullback(dout)

    mosaic = lambda *a: ops.mosaic(*a[:3], a[3], **options, **mosaic_only)
    xla = lambda *a: blocksparse_attention_xla(*a[:3], a[3], **options)
    args = (q, k, v, aux)
    # (each finished before the next starts: on a CPU, Mosaic GPU interpret mode's threads block inside
    # XLA's runtime, and work dispatched beside them can starve them)
    ref_out = jax.block_until_ready(jax.jit(lambda *a: xla(*a))(*args))
    out = jax.block_until_ready(jax.jit(lambda *a: mosaic(*a))(*args))
    log(f"  forward: rel err {rel(out, ref_out):.2e}")
    ref_out, ref_grads = jax.block_until_ready(jax.jit(functools.partial(vjp, xla))(*args))
    out, grads = jax.block_until_ready(jax.jit(functools.partial(vjp, mosaic))(*args))
    errs = [rel(out, ref_out)] + [rel(g, r) for g, r in zip(grads, ref_grads, strict=True)]
    rows = np.concatenate([np.arange(r * BLOCK, min((r + 1) * BLOCK, q_len)) for r in empty_rows] or [[]]).astype(int)
    empty_out = float(jnp.max(jnp.abs(out[:, :, rows].astype(jnp.float32)))) if rows.size else 0.0
    empty_dq = float(jnp.max(jnp.abs(grads[0][:, :, rows].astype(jnp.float32)))) if rows.size else 0.0
    tols = (2e-2, 4e-2, 4e-2, 4e-2, 4e-2)
    ok = all(e <= t for e, t in zip(errs, tols, strict=False)) and empty_out == 0.0 and empty_dq == 0.0
    names = ("fwd", "dq", "dk", "dv", "dsinks")
    log(
        f"  {'PASS' if ok else 'FAIL'} rel err vs xla: "
        + "  ".join(f"{n} {e:.2e}" for n, e in zip(names, errs, strict=False))
        + f"; max |out|, |dq| on the {rows.size} rows that attend nothing: {empty_out}, {empty_dq}"
    )
    return ok


# ---- (b) timings ----

MOSAIC_FWD = {  # name: forward params (table tiles stay 128 x 128)
    "mosaic": None,
    "mosaic fwd 3 stages": FwdParams(num_stages=3),
    "mosaic fwd steps 64": FwdParams(block_n=64, num_stages=3),
    "mosaic fwd 2 q tiles/CTA": FwdParams(block_m=256),
}
MOSAIC_BWD = {  # name: (forward params, backward params, fused_backward)
    "mosaic": (None, None, False),
    "mosaic bwd steps 128/64": (None, BwdParams(block_k=128), False),
    "mosaic bwd steps 64/128": (None, BwdParams(block_q=128), False),
    "mosaic bwd 2 stages": (None, BwdParams(num_stages=2), False),
    "mosaic fused bwd": (None, None, True),
}


def timings(ops: Ops, shape, backward: bool, repeats: int, only: str, budget: float):
    batch, seq, heads, dim = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, heads, seq, dim), jnp.bfloat16) for key in keys)
    qs, ks, vs = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # dense flash attention's layout, made once
    mode = "fwd+bwd" if backward else "fwd"
    variants, densities = {"dense flash_attention (auto)": (lambda q, k, v: flash_attention(q, k, v), True)}, {}
    table = MOSAIC_BWD if backward else {n: (f, None, False) for n, f in MOSAIC_FWD.items()}
    masks = {f"{target:.0%}": block_pattern(seq, seq, target, seed=0) for target in (0.10, 0.25)}
    # In the order they compile (the --budget cuts the tail): Triton, the default Mosaic kernels, the tilings.
    for name in ["triton", *table]:
        for label, (mask, density) in masks.items():
            options = dict(attention_mask=mask, causal=False)
            densities[f"{name} {label}"] = density
            if name == "triton":
                if not ops.smoke:  # (Pallas-Triton's interpret mode does not run under Mosaic GPU's)
                    variants[f"triton {label}"] = (functools.partial(ops.triton, **options), False)
                continue
            fwd, bwd, fused = table[name]
            cfg = BlockSparseAttentionConfig(platform="pallas", fwd_params=fwd, bwd_params=bwd)
            variants[f"{name} {label}"] = (
                functools.partial(ops.mosaic, cfg=cfg, fused_backward=fused, **options),
                False,
            )
    variants = {n: x for n, x in variants.items() if n.startswith(("dense", "triton")) or only in n}
    ready = {}
    for name, (fn, dense) in variants.items():
        if elapsed() > budget:
            log(f"{mode} {name}: skipped (past the {budget:.0f}s budget)")
            continue
        args = (qs, ks, vs) if dense else (q, k, v)
        if backward:
            step = jax.jit(jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
        else:
            step = jax.jit(fn)
        call = functools.partial(step, *args)
        try:
            log(f"{mode} {name}: compiling")
            t = time.perf_counter()
            jax.block_until_ready(call())
            log(f"{mode} {name}: compiled and ran once in {time.perf_counter() - t:.1f}s")
            ready[name] = call
        except Exception as err:
            log(f"{mode} {name}: FAILED\n    {first_lines(err)}")
    log(f"{mode}: timing {len(ready)} variants, {repeats} interleaved rounds")
    seconds = time_fns(ready, repeats=repeats, warmup=2)
    dense = seconds.get("dense flash_attention (auto)", float("nan"))
    log(f"{mode}: timed")
    return [
        (mode, name, s, densities.get(name), s / (densities[name] * dense) if densities.get(name) else None)
        for name, s in seconds.items()
    ]


def even_pattern(seq: int, per_row: int):
    """(bool mask [1, 1, S, S] on the device, density): every 128-row query tile lists `per_row` key tiles spread
    over the keys, and every key tile is listed by `per_row` query tiles (tile (r, (r + j * n / per_row) mod n))."""
    n = seq // BLOCK
    tiles = np.zeros((n, n), bool)
    rows = np.arange(n)[:, None]
    tiles[rows, (rows + np.arange(per_row)[None] * (n // per_row)) % n] = True
    dense = np.repeat(np.repeat(tiles, BLOCK, 0), BLOCK, 1)
    return jnp.asarray(dense[None, None]), float(tiles.mean())


def costs(ops: Ops, shape, per_row: list[int], repeats: int, paired: bool = False):
    """The Mosaic kernels' time against the key tiles each query tile lists (all alike, so no CTA waits on
    another): a line `time = fixed + per_tile * n` per mode, and its cost per CTA and per listed tile.
    `paired`: two query tiles per forward CTA (`fwd_params.block_m=256`), whose second tile's loads start
    while the first runs: the drop of the fixed cost is what a CTA's start and end cost beside the
    pipeline's fill and drain, which each tile still pays."""
    batch, seq, heads, dim = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, heads, seq, dim), jnp.bfloat16) for key in keys)
    loss = lambda fn: jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    calls = {}
    cfg = BlockSparseAttentionConfig(platform="pallas", fwd_params=FwdParams(block_m=256)) if paired else None
    for n in per_row:
        fn = functools.partial(ops.mosaic, attention_mask=even_pattern(seq, n)[0], causal=False, cfg=cfg)
        for mode, step in (("fwd", jax.jit(fn)), ("fwd+bwd", jax.jit(loss(fn)))):
            calls[(mode, n)] = functools.partial(step, q, k, v)
            jax.block_until_ready(calls[(mode, n)]())
        log(f"costs: {n} tiles per row compiled")
    seconds = time_fns(calls, repeats=repeats, warmup=2)
    waves = batch * heads * (seq // BLOCK) / getattr(jax.devices()[0], "core_count", 1)
    for mode in ("fwd", "fwd+bwd"):
        n = np.array(per_row, float)
        t = np.array([seconds[(mode, m)] for m in per_row]) * 1e6
        per_tile, fixed = np.polyfit(n, t, 1)
        print(f"{mode:8s} " + "  ".join(f"n={m}: {x:.1f} us" for m, x in zip(per_row, t, strict=True)))
        print(
            f"{mode:8s} fit: {fixed:.1f} + {per_tile:.2f} n us; per query tile ({waves:.1f} per SM): "
            f"{fixed / waves:.2f} us fixed, {per_tile / waves:.3f} us per listed tile"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--skip-bwd", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", default="", help="time only the Mosaic variants whose name contains this")
    parser.add_argument("--budget", type=float, default=210.0, help="seconds after which no further variant compiles")
    parser.add_argument("--stall", type=float, default=150.0, help="watchdog: seconds without progress")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on a CPU, Mosaic in interpret mode")
    parser.add_argument("--costs", default="", help="only fit time to listed tiles per row at these counts (1,4,16)")
    parser.add_argument("--paired", action="store_true", help="--costs with two query tiles per forward CTA")
    args = parser.parse_args()
    start_watchdog(args.stall)
    device = jax.devices()[0]
    log(f"device {device.device_kind} ({getattr(device, 'compute_capability', '?')}), jax {jax.__version__}")
    ops = Ops(args.cpu_smoke)
    results, rows = [], []
    shape = (1, 512, 2, 128) if args.cpu_smoke else (1, 16384, 16, 128)
    if args.costs:
        with ops.context():
            per_row = [int(n) for n in args.costs.split(",")]
            costs(ops, shape, per_row, 2 if args.cpu_smoke else args.repeats, args.paired)
        return
    with ops.context():
        if not args.skip_check:
            for case in check_cases(args.cpu_smoke):
                try:
                    results.append((case[0], check(ops, *case)))
                except Exception as err:
                    log(f"check {case[0]}: FAILED\n    {first_lines(err)}")
                    results.append((case[0], False))
        for backward in (False,) if args.skip_bwd else (False, True):
            try:
                repeats = 2 if args.cpu_smoke else args.repeats
                rows += timings(ops, shape, backward, repeats, args.variants, args.budget)
            except Exception as err:
                log(f"timings {'fwd+bwd' if backward else 'fwd'}: FAILED\n    {first_lines(err)}")
    print()
    if results:
        print("checks: " + ", ".join(f"{name} {'PASS' if ok else 'FAIL'}" for name, ok in results))
    batch, seq, heads, dim = shape
    print(
        f"B={batch} S={seq} H={heads} D={dim} bf16, random {BLOCK}x{BLOCK} blocks, not causal, on {device.device_kind}"
    )
    print("target (issue 27): forward+backward time <= 1.3 x density x dense")
    print(f"{'mode':8s} {'variant':34s} {'ms':>8s} {'density':>8s} {'t/(d*dense)':>12s}")
    for mode, name, s, density, ratio in rows:
        d = f"{density:8.3f}" if density is not None else f"{'':8s}"
        r = f"{ratio:12.2f}" if ratio is not None else f"{'':12s}"
        print(f"{mode:8s} {name:34s} {1e3 * s:8.3f} {d} {r}")
    log("done")


if __name__ == "__main__":
    main()
