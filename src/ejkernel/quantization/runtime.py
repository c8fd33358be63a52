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

    With the defaults everything is deterministic: affine metadata in float32, dequantization in float32.
    The strategy fields never change a result.

    Attributes:
        affine_metadata_dtype: Storage of affine `scales` and `zeros`: `"input"` (the weight's dtype),
            `"bf16"`, `"fp16"` or `"fp32"` (default). Codes are computed from the stored (rounded) values.
        prefer_compute_dtype: Dtype of the dequantization arithmetic: `"bf16"`, `"fp16"` or `"fp32"`
            (default).
        dequant_output_dtype: Dtype `dequantize` returns: `"compute"` (the compute dtype), `"bf16"`,
            `"fp16"` or `"fp32"` (default).
        dequant_unpack_policy: Strategy only: `"auto"` (default), `"fast"` (split words; widths dividing
            32) or `"generic"` (read each code from the words it spans).
        enable_threshold_codebook: Strategy only: nearest codes by binary search over midpoints (True,
            default) or by the smallest distance to every code (False).

    Raises:
        ValueError: A field outside its domain.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import QuantRuntimeConfig, dequantize, quantize
        >>> cfg = QuantRuntimeConfig(affine_metadata_dtype="bf16", dequant_output_dtype="bf16")
        >>> w_q, scales, zeros = quantize(np.ones((64, 64), np.float32), runtime_config=cfg)
        >>> print(scales.dtype, dequantize(w_q, scales, zeros, runtime_config=cfg).dtype)
        bfloat16 bfloat16
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
        """Dtype of affine scales and zeros for weights of `input_dtype`.

        Args:
            input_dtype: The weights' dtype.

        Returns:
            `input_dtype` for `"input"`, else the dtype `affine_metadata_dtype` names.
        """
        name = self.affine_metadata_dtype
        return jnp.dtype(input_dtype if name == "input" else _DTYPES[name])

    @property
    def compute_dtype(self) -> jnp.dtype:
        """The dtype `prefer_compute_dtype` names."""
        return jnp.dtype(_DTYPES[self.prefer_compute_dtype])

    @property
    def output_dtype(self) -> jnp.dtype:
        """The dtype `dequantize` returns: `compute_dtype` for `"compute"`, else the one named."""
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
    """Forget runtime autotune decisions: there are none to forget, so this does nothing.

    `quantize` and `dequantize` never time alternatives (their dtypes come from `QuantRuntimeConfig` alone);
    it exists for upstream callers. Tuned `quantized_matmul` tilings live in the executor's config caches:
    `ejkernel.ops.reset_caches()` clears those.

    Returns:
        None.

    Example:
        >>> from ejkernel.quantization import clear_runtime_autotune_cache, runtime_autotune_cache_sizes
        >>> clear_runtime_autotune_cache()
        >>> runtime_autotune_cache_sizes()
        (0, 0)
    """


def runtime_autotune_cache_sizes() -> tuple[int, int]:
    """The sizes of the runtime autotune cache, which stays empty: nothing is timed.

    Exists for upstream callers (see `clear_runtime_autotune_cache`).

    Returns:
        `(quantize entries, dequantize entries)`, always `(0, 0)`.

    Example:
        >>> from ejkernel.quantization import runtime_autotune_cache_sizes
        >>> runtime_autotune_cache_sizes()
        (0, 0)
    """
    return 0, 0
