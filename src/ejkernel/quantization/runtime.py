"""`QuantRuntimeConfig`: the dtypes of affine metadata, of dequantization arithmetic and of its output, and
strategy flags that never change a result.

With `runtime_config=None` everything is deterministic: affine scales and zeros in float32 (float16
metadata overflows for narrow-range groups), nf4 scales in the input's dtype, dequantized values in float32.
Nothing here is measured or timed, so there is no runtime autotune cache: `clear_runtime_autotune_cache`
and `runtime_autotune_cache_sizes` exist for upstream callers and describe that empty state.
"""

import dataclasses

import jax.numpy as jnp

from ejkernel.quantization.packing import UNPACK_POLICIES

_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


@dataclasses.dataclass(frozen=True)
class QuantRuntimeConfig:
    """Options of `quantize` / `dequantize` beyond the format (hashable: usable as a static jit argument).

    - `affine_metadata_dtype`: storage of affine `scales` and `zeros`, `"input"` (the weight's dtype),
      `"bf16"`, `"fp16"` or `"fp32"` (default). Codes are computed from the stored (rounded) values.
    - `prefer_compute_dtype`: dtype of the dequantization arithmetic, `"bf16"`, `"fp16"` or `"fp32"`.
    - `dequant_output_dtype`: dtype `dequantize` returns, `"compute"` (the compute dtype), `"bf16"`,
      `"fp16"` or `"fp32"` (default).
    - `dequant_unpack_policy` (strategy only): `"auto"`, `"fast"` (split words, widths dividing 32) or
      `"generic"` (read each code from the words it spans).
    - `enable_threshold_codebook` (strategy only): nearest codes by binary search over midpoints (True)
      or by the smallest distance to every code (False).
    """

    affine_metadata_dtype: str = "fp32"
    prefer_compute_dtype: str = "fp32"
    dequant_output_dtype: str = "fp32"
    dequant_unpack_policy: str = "auto"
    enable_threshold_codebook: bool = True

    def __post_init__(self) -> None:
        for name, allowed in (
            ("affine_metadata_dtype", ("input", *_DTYPES)),
            ("prefer_compute_dtype", tuple(_DTYPES)),
            ("dequant_output_dtype", ("compute", *_DTYPES)),
            ("dequant_unpack_policy", UNPACK_POLICIES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"QuantRuntimeConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.enable_threshold_codebook, bool):
            raise ValueError(
                f"QuantRuntimeConfig.enable_threshold_codebook must be a bool, got {self.enable_threshold_codebook!r}"
            )

    def metadata_dtype(self, input_dtype) -> jnp.dtype:
        """Dtype of affine scales and zeros for weights of `input_dtype`."""
        name = self.affine_metadata_dtype
        return jnp.dtype(input_dtype if name == "input" else _DTYPES[name])

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(_DTYPES[self.prefer_compute_dtype])

    @property
    def output_dtype(self) -> jnp.dtype:
        name = self.dequant_output_dtype
        return self.compute_dtype if name == "compute" else jnp.dtype(_DTYPES[name])


DEFAULT_RUNTIME = QuantRuntimeConfig()


def resolve_runtime(runtime_config) -> QuantRuntimeConfig:
    """The given config, or the deterministic defaults for None."""
    if runtime_config is None:
        return DEFAULT_RUNTIME
    if not isinstance(runtime_config, QuantRuntimeConfig):
        raise ValueError(f"runtime_config must be a QuantRuntimeConfig or None, got {type(runtime_config).__name__}")
    return runtime_config


def clear_runtime_autotune_cache() -> None:
    """Forget runtime autotune decisions: there are none to forget, since `quantize` and `dequantize` never
    time alternatives (their dtypes come from `QuantRuntimeConfig` alone). Tuned `quantized_matmul` tilings
    live in the executor's config caches: `ejkernel.ops.reset_caches()` clears those."""


def runtime_autotune_cache_sizes() -> tuple[int, int]:
    """`(quantize entries, dequantize entries)` of the runtime autotune cache: always `(0, 0)`, as nothing
    is timed (see `clear_runtime_autotune_cache`)."""
    return 0, 0
