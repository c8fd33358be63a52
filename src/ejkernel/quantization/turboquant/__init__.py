"""TurboQuant helpers: the Lloyd-Max codebook (`codebook`) and the rotation and projection matrices
(`matrices`) that EasyDeL builds its compressed KV caches with."""

from ejkernel.quantization.turboquant.codebook import LloydMaxCodebook, solve_lloyd_max
from ejkernel.quantization.turboquant.matrices import generate_projection_matrix, generate_rotation_matrix

__all__ = ["LloydMaxCodebook", "generate_projection_matrix", "generate_rotation_matrix", "solve_lloyd_max"]
