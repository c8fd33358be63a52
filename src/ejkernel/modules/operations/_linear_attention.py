"""What the linear-attention ops' `Kernel` classes and configs share (gla, lightning, recurrent, the delta rules)."""

import dataclasses

from ejkernel.kernels._common.linear_attention.checks import check_chunk_size
from ejkernel.ops import Invocation, Kernel
from ejkernel.ops.config import KernelConfig


@dataclasses.dataclass(frozen=True)
class ChunkedConfig(KernelConfig):
    """Base of the linear-attention family's configs: the platform and the chunked form's tiling. No field
    changes the result beyond rounding.

    Attributes:
        chunk_size: Tokens per chunk of the chunked form, a positive power of two; None (default): 64, or 32 on
            Triton except for the delta rules. Lowered to the sequence length rounded up to a power of two (16 at
            least on Triton). Triton's delta rules run at most 32 where that is faster (differentiated, and in the
            one-pass forward), and so does its gated recurrence with gates per key channel (`gla_attention`),
            always.
        platform: `"auto"` (default: the executor chooses), `"xla"` or `"triton"`.
        fwd_params: `block_d` (value columns per program), `num_warps` and `num_stages` of Triton's one-token
            (decode) kernel and, for the delta rules, its state-passing kernels; the other chunked kernels keep
            their own tiling. None, or a field not set: each kernel's own (32 columns, 4 warps, 2 stages; the
            delta rules' forward state pass: up to 128 columns at 8 warps and 3 stages where the batch rows and
            heads leave enough programs).
        bwd_params: Not read.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: `chunk_size` is not a positive power of two, or `platform` or `backend` is unknown.
    """

    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_chunk_size(f"{type(self).__name__}.chunk_size", self.chunk_size)


class ChunkedKernel(Kernel):
    """Base of the family's Kernel classes: autotuning tries the default config and a few chunk sizes, for
    a training call on forward + backward (q, k and v differentiated): the chunk with the fastest forward
    trains slower (H100, GLA at B=2 S=16384 H=16 D=128: forward fastest at 64, forward+backward 6.0 ms at
    32 against 10.0 at 64)."""

    tune_argnums = (0, 1, 2)

    def chunk_sizes(self, inv: Invocation) -> tuple[int, ...]:
        del inv
        return (32, 64, 128)

    def platform_cfgs(self, platform: str, inv: Invocation):
        yield self.config_type(platform=platform)
        for size in self.chunk_sizes(inv):
            yield self.config_type(platform=platform, chunk_size=size)
