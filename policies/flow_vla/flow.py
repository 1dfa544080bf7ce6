"""Flow matching over action chunks, as pure functions (each tested against hand-computed numbers).

Convention (pi0's): time runs from data (t = 0) to noise (t = 1),

    x_t = t · ε + (1 − t) · a,        ε ~ N(0, I),  a the (normalised) action chunk,
    u   = dx_t/dt = ε − a             the target velocity the network v_θ(x_t, t | o) regresses,

and sampling integrates dx/dt = v_θ backwards with Euler steps from x_1 = ε at t = 1 to t = 0:

    x_{t − Δ} = x_t − Δ · v_θ(x_t, t),    Δ = 1 / num_steps.

Training times are t = scale · Beta(α, 1) + offset (α = 1.5, scale 0.999, offset 0.001: t ∈ [0.001, 1.0], mean
0.999·α/(α+1) + 0.001), which puts more weight on noisy times. Beta(α, 1) has CDF x^α, so it is drawn exactly
and seedably as U^(1/α).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

# (x_t [B, ...], t [B], step k) -> v [B, ...]; k = 0..num_steps-1 lets a sampler reuse what it computed per step
VelocityFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def sample_time(num: int, alpha: float = 1.5, scale: float = 0.999, offset: float = 0.001,
                generator: torch.Generator | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """t = scale · Beta(alpha, 1) + offset, [num] float32 (inverse-CDF draw: Beta(α, 1) = U^(1/α))."""
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    u = torch.rand(num, generator=generator, device=device)
    return scale * u.pow(1.0 / alpha) + offset


def interpolate(action: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = t · ε + (1 − t) · a for chunks [B, H, A] and times [B]."""
    t = t.reshape(-1, *([1] * (action.dim() - 1)))
    return t * noise + (1.0 - t) * action


def target_velocity(action: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """u = ε − a, the velocity of the straight path from a to ε."""
    return noise - action


def flow_matching_loss(velocity: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor | None = None) -> torch.Tensor:
    """Masked MSE: mean over the non-padded steps of the per-step mean of (v − u)² over action dims.

    Args:
        velocity: v_θ [B, H, A].
        target: u [B, H, A].
        is_pad: bool [B, H], True where the chunk's step lies past the episode's end (excluded); None keeps all.
    """
    per_step = (velocity - target).pow(2).mean(dim=-1)  # [B, H]
    if is_pad is None:
        return per_step.mean()
    keep = (~is_pad).to(per_step.dtype)
    return (per_step * keep).sum() / keep.sum().clamp_min(1.0)


def euler_times(num_steps: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The times [num_steps] at which ``euler_integrate`` evaluates v: t_k = 1 − k / num_steps (1, 1 − Δ, ..., Δ)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    return 1.0 - torch.arange(num_steps, dtype=torch.float32, device=device) / num_steps


def euler_integrate(velocity_fn: VelocityFn, x1: torch.Tensor, num_steps: int) -> torch.Tensor:
    """x_0 from x_1 [B, ...] by ``num_steps`` Euler steps of dx/dt = v from t = 1 to t = 0:
    x_{t_k − Δ} = x_{t_k} − Δ · v(x_{t_k}, t_k, k) at t_k = ``euler_times(num_steps)[k]``."""
    dt = 1.0 / num_steps
    x = x1
    for k, t in enumerate(euler_times(num_steps, x.device).to(x.dtype)):
        x = x - dt * velocity_fn(x, t.expand(x.shape[0]), k)
    return x


def guided_velocity(v_uncond: torch.Tensor, v_cond: torch.Tensor, beta: float) -> torch.Tensor:
    """Classifier-free guidance: v = v_u + β (v_c − v_u) (β = 1: the conditional velocity; β > 1 sharpens)."""
    return v_uncond + beta * (v_cond - v_uncond)


def time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] of t [B] (t in [0, 1]): [sin(2π t / p_i), cos(2π t / p_i)] over dim/2 periods
    p_i spaced geometrically from ``min_period`` to ``max_period`` (pi0's)."""
    if dim % 2:
        raise ValueError(f"time embedding dim must be even, got {dim}")
    half = dim // 2
    frac = torch.linspace(0.0, 1.0, half, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** frac
    angle = (2 * math.pi / period).to(t.dtype)[None, :] * t[:, None]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


SAMPLE_REDUCTIONS = ("mean", "median", "medoid")


def reduce_samples(x: torch.Tensor, how: str = "mean", median_dims: Sequence[int] = ()) -> torch.Tensor:
    """One chunk [N, H, A] from K sampled chunks per row [N, K, H, A].

    - ``mean``: their mean (an estimate of the conditional mean chunk; between two modes it lies in neither);
    - ``median``: the per-coordinate median (the lower middle value when K is even, as ``torch.median``);
    - ``medoid``: the sampled chunk whose summed Euclidean distance to the row's other chunks is least (a chunk the
      sampler produced, so it stays inside one mode; the first such on ties).

    The action dimensions ``median_dims`` then take the per-coordinate median whatever ``how`` is: for a dimension
    whose samples split between modes (a wrist roll that may turn either way to a square cube's faces, a gripper
    that closes now or a step later) the median lies in the larger mode, the mean between them.
    """
    if x.dim() != 4:
        raise ValueError(f"samples must be [N, K, H, A], got shape {list(x.shape)}")
    out = _reduce(x, how)
    if median_dims:
        dims = list(median_dims)
        out[..., dims] = x[..., dims].median(dim=1).values
    return out


def _reduce(x: torch.Tensor, how: str) -> torch.Tensor:
    if how == "mean":
        return x.mean(dim=1)
    if how == "median":
        return x.median(dim=1).values
    if how == "medoid":
        flat = x.flatten(2)  # [N, K, H·A]
        total = torch.cdist(flat, flat).sum(dim=-1)  # [N, K]
        pick = total.argmin(dim=1)
        return x[torch.arange(x.shape[0], device=x.device), pick]
    raise ValueError(f"unknown sample reduction {how!r}; expected one of {SAMPLE_REDUCTIONS}")
