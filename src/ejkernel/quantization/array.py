"""`QuantizedArray`: packed codes and metadata kept together with the format they were made in."""

import dataclasses

import jax

from ejkernel.quantization.decode import dequantize
from ejkernel.quantization.encode import prepack_quantized_weights, quantize
from ejkernel.quantization.modes import resolve_axis, resolve_params
from ejkernel.quantization.runtime import QuantRuntimeConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedArray:
    """Packed codes and metadata kept together with the format they were made in.

    A pytree: the arrays `data`, `scales` and `zeros` (affine only) are its leaves; `mode`, `group_size`,
    `bits`, `axis` (the grouping `quantize` used) and `runtime_config` are static. Made by `quantize_array`
    and `prepack_quantized_array`.

    Attributes:
        data: uint32 packed codes `[..., R, words]`.
        scales: `[..., R, n_groups]` group metadata: float for affine and nf4, uint8 for mx and nv modes.
        zeros: Affine zero points shaped like `scales`; None for the other modes.
        mode: The quantization mode (default `"affine"`).
        group_size: Values per group (default 64).
        bits: Code width (default 4).
        axis: `"row"` or `"col"`, the grouping `quantize` used (default `"row"`).
        runtime_config: The `QuantRuntimeConfig` it was made with, or None (default).

    Example:
        >>> import jax, numpy as np
        >>> from ejkernel.quantization import quantize_array
        >>> qa = quantize_array(np.ones((64, 32), np.float32), mode="nf4")
        >>> print(qa.data.shape, qa.scales.shape, qa.zeros, qa.mode, qa.group_size, qa.bits, qa.axis)
        (32, 8) (32, 1) None nf4 64 4 row
        >>> qa.dequantize().shape, len(qa.as_tuple()), len(jax.tree_util.tree_leaves(qa))
        ((32, 64), 2, 2)
    """

    data: jax.Array
    scales: jax.Array
    zeros: jax.Array | None
    mode: str = dataclasses.field(default="affine", metadata={"static": True})
    group_size: int = dataclasses.field(default=64, metadata={"static": True})
    bits: int = dataclasses.field(default=4, metadata={"static": True})
    axis: str = dataclasses.field(default="row", metadata={"static": True})
    runtime_config: QuantRuntimeConfig | None = dataclasses.field(default=None, metadata={"static": True})

    def as_tuple(self) -> tuple:
        """The arrays as `quantize` returns them.

        Returns:
            `(data, scales, zeros)` for affine, else `(data, scales)`.
        """
        return (self.data, self.scales, self.zeros) if self.mode == "affine" else (self.data, self.scales)

    def dequantize(self) -> jax.Array:
        """The values in the grouped layout (see `dequantize`).

        Returns:
            `[..., R, n_groups · group_size]` values, float32 unless `runtime_config` says otherwise.

        Raises:
            ValueError: The arrays do not fit the format (see `dequantize`).
        """
        return dequantize(
            self.data,
            self.scales,
            self.zeros,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
            axis=self.axis,
            runtime_config=self.runtime_config,
        )


def _wrap(out, params, axis: str, runtime_config) -> QuantizedArray:
    zeros = out[2] if params.mode == "affine" else None
    return QuantizedArray(out[0], out[1], zeros, params.mode, params.group_size, params.bits, axis, runtime_config)


def quantize_array(w, /, group_size=None, bits=None, mode="affine", axis="row", runtime_config=None) -> QuantizedArray:
    """`quantize` with its result and format in one `QuantizedArray`.

    Args:
        w: `[..., A, B]` float, rank >= 2.
        group_size: As `quantize`'s; None (default): the mode's default.
        bits: As `quantize`'s; None (default): 4 for affine.
        mode: As `quantize`'s (default `"affine"`).
        axis: `"row"` (default) or `"col"`, as `quantize`'s.
        runtime_config: A `QuantRuntimeConfig`, or None (default).

    Returns:
        A `QuantizedArray` holding `quantize(w, ...)`'s arrays and the resolved format (mode lower-cased,
        group size and bits filled in).

    Raises:
        ValueError: `quantize`'s errors.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import quantize_array
        >>> qa = quantize_array(np.ones((128, 64), np.float32), bits=8)
        >>> print(qa.data.shape, qa.scales.shape, qa.zeros.shape, qa.bits)
        (64, 32) (64, 2) (64, 2) 8
    """
    params = resolve_params(mode, group_size, bits)
    out = quantize(w, group_size, bits, mode, axis, runtime_config)
    return _wrap(out, params, resolve_axis(axis), runtime_config)


def prepack_quantized_array(
    w, /, group_size=None, bits=None, mode="affine", transpose=True, axis=None, runtime_config=None
) -> QuantizedArray:
    """`prepack_quantized_weights` with its result and format in one `QuantizedArray`.

    Args:
        w: `[..., A, B]` float, rank >= 2 (a kernel `[in, out]`).
        group_size: As `quantize`'s; None (default): the mode's default.
        bits: As `quantize`'s; None (default): 4 for affine.
        mode: As `quantize`'s (default `"affine"`).
        transpose: A bool (default True): `axis` `"row"` if True, else `"col"`, when `axis` is None.
        axis: `"row"` or `"col"`, overriding `transpose`; None (default).
        runtime_config: A `QuantRuntimeConfig`, or None (default).

    Returns:
        A `QuantizedArray` holding the arrays and the resolved format, `axis` the one used.

    Raises:
        ValueError: `prepack_quantized_weights`'s errors.

    Example:
        >>> import numpy as np
        >>> from ejkernel.quantization import prepack_quantized_array
        >>> qa = prepack_quantized_array(np.ones((64, 128), np.float32), transpose=False)
        >>> print(qa.data.shape, qa.scales.shape, qa.axis)
        (64, 16) (64, 2) col
    """
    params = resolve_params(mode, group_size, bits)
    out = prepack_quantized_weights(w, group_size, bits, mode, transpose, axis, runtime_config)
    return _wrap(out, params, axis if axis is not None else ("row" if transpose else "col"), runtime_config)
