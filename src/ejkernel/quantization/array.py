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
    """A pytree: the arrays `data` (uint32 codes), `scales`, `zeros` (affine only) are its leaves; `mode`,
    `group_size`, `bits`, `axis` (the grouping `quantize` used) and `runtime_config` are static."""

    data: jax.Array
    scales: jax.Array
    zeros: jax.Array | None
    mode: str = dataclasses.field(default="affine", metadata={"static": True})
    group_size: int = dataclasses.field(default=64, metadata={"static": True})
    bits: int = dataclasses.field(default=4, metadata={"static": True})
    axis: str = dataclasses.field(default="row", metadata={"static": True})
    runtime_config: QuantRuntimeConfig | None = dataclasses.field(default=None, metadata={"static": True})

    def as_tuple(self) -> tuple:
        """`(data, scales, zeros)` for affine, else `(data, scales)`: what `quantize` returns."""
        return (self.data, self.scales, self.zeros) if self.mode == "affine" else (self.data, self.scales)

    def dequantize(self) -> jax.Array:
        """The values in the grouped layout (see `dequantize`)."""
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
    """`quantize(...)` with its result and format in one `QuantizedArray`."""
    params = resolve_params(mode, group_size, bits)
    out = quantize(w, group_size, bits, mode, axis, runtime_config)
    return _wrap(out, params, resolve_axis(axis), runtime_config)


def prepack_quantized_array(
    w, /, group_size=None, bits=None, mode="affine", transpose=True, axis=None, runtime_config=None
) -> QuantizedArray:
    """`prepack_quantized_weights(...)` with its result and format in one `QuantizedArray`."""
    params = resolve_params(mode, group_size, bits)
    out = prepack_quantized_weights(w, group_size, bits, mode, transpose, axis, runtime_config)
    return _wrap(out, params, axis if axis is not None else ("row" if transpose else "col"), runtime_config)
