"""Flash attention: TFLOP/s of each implementation beside cuDNN and XLA, bf16, forward and forward+backward.

FLOPs count 4·B·H·Sq·Sk·D for the forward (halved when causal) and 3.5× that for forward+backward.
With --features, rows also time each of our kernels with soft cap, sinks and segment ids, which cuDNN cannot do.
Each row names the kernels `platform="auto"` ran ("auto ran").
`--part fp8` times the float8 (e4m3) forward at the anchor shapes of head dim 128 instead, beside our bf16
forward and cuDNN's bf16 forward, with its TFLOP/s ratio to cuDNN's. `--window L,R` gives every call of the bf16
rows a sliding window (keys `q - L <= k <= q + R`; cuDNN's `local_window_size`), its FLOPs counted over the pairs it
allows. `--shape B,S,H,D[,Hkv]` runs given shapes instead of the anchors; `Hkv` key/value heads (dividing H) make
it grouped-query attention.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ejkernel.benchmarks._harness import grouped_bars, parser, print_table, time_variants, write_results
from ejkernel.modules import flash_attention
from ejkernel.registry import kernel_registry
from ejkernel.types import MaskInfo

OPS = ("flash_attention",)
"""The ops this benchmark times (`ejkernel bench <op>` runs it)."""

# The eight shapes of anchors.md: 16k tokens per call.
SHAPES = [(1, 16384, 16, 128), (2, 8192, 16, 128), (8, 2048, 16, 128), (8, 2048, 32, 64)]
QUICK_SHAPES = [(1, 256, 2, 64)]
FP8_QUICK_SHAPES = [(1, 256, 2, 128)]
FP8_DESCALES = dict(q_descale=0.25, k_descale=0.25, v_descale=0.25)  # the float8 rows hold codes of 4x the inputs


def parse_shape(text: str) -> tuple[int, ...]:
    """`(B, S, H, D[, Hkv])` of a `--shape`; a ValueError unless 4 or 5 positive integers with Hkv dividing H."""
    fields = text.split(",")
    shape = tuple(int(f) for f in fields if f.strip().isdigit() and int(f) > 0)
    if len(shape) != len(fields) or len(shape) not in (4, 5) or shape[2] % _dims(shape)[4]:
        raise ValueError(f"--shape must be B,S,H,D or B,S,H,D,Hkv (positive integers, Hkv dividing H), got {text}")
    return shape


def _dims(shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """`(B, S, H, D, Hkv)` of a shape with or without its key/value heads (H unless given)."""
    return (*shape[:4], shape[4] if len(shape) == 5 else shape[2])


def _inputs(shape: tuple[int, ...]):
    """Random normal query `[B, S, H, D]`, key and value `[B, S, Hkv, D]`."""
    batch, seq, heads, dim, kv_heads = _dims(shape)
    keys = jax.random.split(jax.random.PRNGKey(seq + heads), 3)
    shapes = [(batch, seq, h, dim) for h in (heads, kv_heads, kv_heads)]
    return tuple(jax.random.normal(key, shape, jnp.bfloat16) for key, shape in zip(keys, shapes, strict=True))


def _row(shape: tuple[int, ...], **fields) -> dict:
    """A result row's leading fields (`Hkv` only where it differs from H)."""
    batch, seq, heads, dim, kv_heads = _dims(shape)
    return dict(B=batch, S=seq, H=heads, **({} if kv_heads == heads else {"Hkv": kv_heads}), D=dim, **fields)


def _reference_fns(window=None):
    """The alternatives a JAX user already has."""
    return {
        f"jax-{impl}": functools.partial(_jax_attention, implementation=impl, window=window)
        for impl in ("cudnn", "xla")
    }


def _jax_attention(q, k, v, causal, *, implementation, window):
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, local_window_size=window, implementation=implementation
    )


def _ours(platform, window=None, **features):
    def fn(q, k, v, causal):
        aux = features.get("sinks")
        kw = features.get("kw", {}) | ({} if window is None else {"sliding_window": window})
        return flash_attention(q, k, v, None, None, None, aux, platform=platform, causal=causal, **kw)

    return fn


def attended_pairs(seq: int, causal: bool, window: tuple[int, int] | None) -> int:
    """(query, key) pairs a call of `seq` tokens attends, as FLOPs count them: all, half (causal, as the anchors
    count it), or those a window allows (counted exactly)."""
    if window is None:
        return seq * seq // 2 if causal else seq * seq
    positions = np.arange(seq)
    first = np.maximum(positions - window[0], 0)
    last = np.minimum(positions + (0 if causal else window[1]), seq - 1)
    return int(np.maximum(last - first + 1, 0).sum())


def _jitted(fn, causal, backward):
    """The jitted forward (or gradient) of `fn(q, k, v)`."""
    if backward:
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, causal).astype(jnp.float32)), argnums=(0, 1, 2)))
    return jax.jit(lambda q, k, v: fn(q, k, v, causal))


# How each GPU kernel shows in a lowered program: the custom call it is made of.
KERNEL_CALLS = {"cudnn": "__cudnn$fmha", "pallas": "mosaic_gpu", "triton": "__gpu$xla.gpu.triton"}


def kernels_called(lowered_text: str) -> str:
    """Which kernels a lowered program calls ("cudnn", "pallas", "triton", joined by +), else "xla".

    This names what `platform="auto"` ran in a row: where it is cuDNN's own kernel, its ratio to cuDNN
    is that of one program timed twice.
    """
    return "+".join(name for name, call in KERNEL_CALLS.items() if call in lowered_text) or "xla"


def _label(row: dict) -> str:
    """`BxSxHxD`, with `/Hkv` after H for grouped-query rows."""
    kv = f"/{row['Hkv']}" if "Hkv" in row else ""
    return f"{row['B']}x{row['S']}x{row['H']}{kv}x{row['D']}"


def _builder(step, *args):
    """A `time_variants` builder of the zero-argument call `step(*args)` (`step` is jitted already)."""
    return lambda: functools.partial(step, *args)


def _fp8_rows(shapes, repeats: int) -> list[dict]:
    """Forward TFLOP/s of float8_e4m3fn inputs (per-tensor descales, `auto`) beside bf16 (`--part fp8`)."""
    on_gpu = jax.default_backend() == "gpu"
    rows = []
    for shape in shapes:
        batch, seq, heads, dim, _ = _dims(shape)
        q, k, v = _inputs(shape)
        # codes of 4x the inputs, descaled by 1/4: the float8 call attends what the bf16 calls do, to e4m3's error
        q8, k8, v8 = ((4 * x).astype(jnp.float8_e4m3fn) for x in (q, k, v))
        fp8 = lambda q, k, v, causal: flash_attention(q, k, v, causal=causal, **FP8_DESCALES)
        variants = {"ejkernel-fp8": (fp8, (q8, k8, v8)), "ejkernel-bf16": (_ours("auto"), (q, k, v))}
        if on_gpu:
            variants["jax-cudnn-bf16"] = (_reference_fns()["jax-cudnn"], (q, k, v))
        for causal in (False, True):
            flops = 4 * batch * heads * dim * attended_pairs(seq, causal, None)
            steps = {name: (_jitted(fn, causal, False), inputs) for name, (fn, inputs) in variants.items()}
            builders = {name: _builder(step, *inputs) for name, (step, inputs) in steps.items()}
            timings = time_variants(builders, repeats=repeats, where=f"B={batch} S={seq} causal={causal} fp8 fwd")
            row = _row(shape, causal=causal, mode="fwd")
            for name in variants:
                row[name] = flops / timings[name] / 1e12 if name in timings else None
            if row.get("jax-cudnn-bf16"):
                for name in ("ejkernel-fp8", "ejkernel-bf16"):
                    if row.get(name):
                        row[f"{name}/cudnn-bf16"] = row[name] / row["jax-cudnn-bf16"]
            if "ejkernel-fp8" in timings:
                step, inputs = steps["ejkernel-fp8"]
                row["fp8 ran"] = kernels_called(step.lower(*inputs).as_text())
            rows.append(row)
            print_table([row], [c for c in row if row[c] is not None])
    return rows


def main(argv=None) -> None:
    p = parser(__doc__)
    p.add_argument("--part", choices=("bf16", "fp8"), default="bf16", help="which rows to time")
    p.add_argument("--features", action="store_true", help="also time soft cap / sinks / segment ids")
    p.add_argument("--shape", action="append", help="B,S,H,D[,Hkv] to run instead of the anchor shapes (repeatable)")
    p.add_argument("--only", help="comma-separated variant names to run (e.g. ejkernel-triton,jax-cudnn)")
    p.add_argument("--window", help="L,R: a sliding window on every call of the bf16 rows")
    args = p.parse_args(argv)
    window = tuple(map(int, args.window.split(","))) if args.window else None
    if window is not None and args.part == "fp8":
        p.error("--window applies to the bf16 rows (--part bf16), not to --part fp8")
    try:
        given = [parse_shape(text) for text in args.shape or ()]
    except ValueError as err:
        p.error(str(err))
    if args.part == "fp8":
        anchors = [shape for shape in SHAPES if shape[3] == 128]
        rows = _fp8_rows(given or (FP8_QUICK_SHAPES if args.quick else anchors), args.repeats)
        print_table(rows, list(dict.fromkeys(c for r in rows for c in r)))

        def plot_fp8(ax, rows):
            labels = [f"{_label(r)}{' causal' if r['causal'] else ''}" for r in rows]
            names = [n for n in ("ejkernel-fp8", "ejkernel-bf16", "jax-cudnn-bf16") if n in rows[0]]
            grouped_bars(ax, labels, {n: [r.get(n) for r in rows] for n in names}, "TFLOP/s (forward)")

        meta = {"dtype": "float8_e4m3fn inputs, bfloat16 output; bf16 rows beside"}
        print(f"wrote {write_results(args.out, 'flash_attention_fp8', rows, meta, plot_fp8)}")
        return
    on_gpu = jax.default_backend() == "gpu"
    ours = ["auto"] + [i.platform.value for i in kernel_registry.candidates("flash_attention")]
    impls = {f"ejkernel-{p}": _ours(p, window) for p in ours}
    if on_gpu:
        impls.update(_reference_fns(window))
    rows = []
    for shape in given or (QUICK_SHAPES if args.quick else SHAPES):
        batch, seq, heads, dim, _ = _dims(shape)
        q, k, v = _inputs(shape)
        variants = dict(impls)
        if args.features:
            segments = jnp.repeat(jnp.arange(4, dtype=jnp.int32), seq // 4)[None].repeat(batch, 0)
            # Each feature (cuDNN serves none of them) on each of our kernels that serves it; its cost is
            # the ratio to the same kernel without it. The Mosaic GPU kernels decline segment ids.
            kernels = ("pallas", "triton") if on_gpu else ("xla",)
            for kernel in kernels:
                variants[f"ejkernel-{kernel}+softcap"] = _ours(kernel, window, kw={"logits_soft_cap": 30.0})
                variants[f"ejkernel-{kernel}+sinks"] = _ours(
                    kernel, window, sinks=jnp.zeros((heads,), jnp.bfloat16) + 0.5
                )
            masked = "triton" if on_gpu else "xla"
            variants[f"ejkernel-{masked}+segments"] = _ours(
                masked, window, kw={"mask_info": MaskInfo.from_segments(segments)}
            )
        if args.only:
            variants = {name: fn for name, fn in variants.items() if name in args.only.split(",")}
        for causal in (False, True):
            flops = 4 * batch * heads * dim * attended_pairs(seq, causal, window)
            for backward in (False, True):
                row = _row(shape, causal=causal, mode="fwd+bwd" if backward else "fwd")
                if window is not None:
                    row["window"] = f"{window[0]},{window[1]}"
                steps = {name: _jitted(fn, causal, backward) for name, fn in variants.items()}
                builders = {name: _builder(step, q, k, v) for name, step in steps.items()}
                where = f"B={batch} S={seq} causal={causal} bwd={backward}"
                timings = time_variants(builders, repeats=args.repeats, where=where)
                for name in variants:
                    row[name] = flops * (3.5 if backward else 1.0) / timings[name] / 1e12 if name in timings else None
                if "ejkernel-auto" in timings:  # (the step already ran: its trace and lowering are cached)
                    row["auto ran"] = kernels_called(steps["ejkernel-auto"].lower(q, k, v).as_text())
                if row.get("jax-cudnn"):
                    for name in variants:
                        if name.startswith("ejkernel") and row.get(name):
                            row[f"{name}/cudnn"] = row[name] / row["jax-cudnn"]
                rows.append(row)
                print_table([row], [c for c in row if row[c] is not None])
    grouped = ["Hkv"] if any("Hkv" in row for row in rows) else []
    lead = ["B", "S", "H", *grouped, "D", "causal", *(["window"] if window else []), "mode"]
    print_table(rows, [*lead, *variants, "auto ran"])
    ratios = [c for c in rows[0] if c.endswith("/cudnn")]
    print_table(rows, [*lead, *ratios, "auto ran"])

    def plot(ax, rows):
        labels = [f"{_label(r)}{' causal' if r['causal'] else ''} {r['mode']}" for r in rows]
        grouped_bars(ax, labels, {name: [r.get(name) for r in rows] for name in variants}, "TFLOP/s (bf16)")

    name = "flash_attention" if window is None else f"flash_attention_window_{window[0]}_{window[1]}"
    path = write_results(args.out, name, rows, {"dtype": "bfloat16", "sliding_window": window}, plot)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
