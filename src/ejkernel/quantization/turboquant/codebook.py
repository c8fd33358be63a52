"""Lloyd-Max scalar codebooks for TurboQuant: the optimal levels for one coordinate of a randomly rotated
unit vector of dimension `dim`.

Such a coordinate has density `c_d (1 - x²)^((d-3)/2)` on [-1, 1], close to `N(0, 1/d)` for large `d`.
Lloyd's iteration alternates the two optimality conditions: each boundary is the midpoint of its two
centroids, and each centroid is the mean of the density over its cell. Cell masses and first moments
come in closed form (normal CDF and pdf; regularised incomplete beta for the exact density).
"""

import dataclasses
import math
import numbers

import numpy as np


@dataclasses.dataclass(frozen=True)
class LloydMaxCodebook:
    """`n_levels = 2**bits` ascending `centroids` (float32) and the `n_levels - 1` `boundaries` between them
    (float32 midpoints of neighbouring centroids), for coordinates of `dim`-dimensional unit vectors."""

    bits: int
    dim: int
    n_levels: int
    centroids: np.ndarray
    boundaries: np.ndarray


def _gaussian_cells(sigma: float):
    """Mass and first moment of `N(0, sigma²)` over cells `[a, b]`."""
    from scipy.special import ndtr

    def cells(a, b):
        a, b = a / sigma, b / sigma
        mass = np.where(a >= 0, ndtr(-a) - ndtr(-b), ndtr(b) - ndtr(a))  # upper tails without cancellation
        pdf = lambda t: np.exp(-0.5 * np.square(t)) / math.sqrt(2 * math.pi)
        return mass, sigma * (pdf(a) - pdf(b))

    return cells


def _sphere_cells(dim: int):
    """Mass and first moment of the density `c_d (1 - x²)^((d-3)/2)` on [-1, 1] over cells `[a, b]`."""
    from scipy.special import betainc

    coeff = math.exp(math.lgamma(dim / 2) - math.lgamma((dim - 1) / 2)) / math.sqrt(math.pi)

    def cdf(x):
        return 0.5 + 0.5 * np.sign(x) * betainc(0.5, (dim - 1) / 2, np.square(x))

    def cells(a, b):
        a, b = np.clip(a, -1.0, 1.0), np.clip(b, -1.0, 1.0)
        mass = np.where(a >= 0, cdf(-a) - cdf(-b), cdf(b) - cdf(a))
        tail = lambda t: (1 - np.square(t)) ** ((dim - 1) / 2)
        return mass, coeff / (dim - 1) * (tail(a) - tail(b))

    return cells


def solve_lloyd_max(
    bits: int, dim: int = 128, max_iters: int = 200, tol: float = 1e-10, use_gaussian_approx: bool = True
) -> LloydMaxCodebook:
    """The Lloyd-Max codebook of `2**bits` levels for the density of one coordinate in dimension `dim`.

    The density is `N(0, 1/dim)` when `use_gaussian_approx` or `dim >= 64`, else the exact one (`dim >= 2`).
    Starts from `linspace(-3σ, 3σ, 2**bits)` (`σ = dim**-0.5`) and stops after `max_iters` iterations or
    once no centroid moves by `tol` or more. Computed in float64 with NumPy (SciPy special functions).
    """
    is_int = lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)
    if not is_int(bits) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an int in 1..8, got {bits!r}")
    gaussian = use_gaussian_approx or (is_int(dim) and dim >= 64)
    if not is_int(dim) or dim < (1 if gaussian else 2):
        raise ValueError(f"dim must be an int >= {1 if gaussian else 2}, got {dim!r}")
    if not is_int(max_iters) or max_iters < 0:
        raise ValueError(f"max_iters must be an int >= 0, got {max_iters!r}")
    bits, dim = int(bits), int(dim)
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol!r}")
    sigma = 1 / math.sqrt(dim)
    cells = _gaussian_cells(sigma) if gaussian else _sphere_cells(dim)
    centroids = np.linspace(-3 * sigma, 3 * sigma, 1 << bits)
    for _ in range(max_iters):
        edges = np.concatenate([[-np.inf], (centroids[:-1] + centroids[1:]) / 2, [np.inf]])
        mass, moment = cells(edges[:-1], edges[1:])
        updated = np.where(mass > 1e-300, moment / np.maximum(mass, 1e-300), centroids)  # empty cell: stays
        change = np.max(np.abs(updated - centroids))
        centroids = updated
        if change < tol:
            break
    levels = centroids.astype(np.float32)
    return LloydMaxCodebook(bits, dim, 1 << bits, levels, (levels[:-1] + levels[1:]) / np.float32(2))
