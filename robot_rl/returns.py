"""Return and advantage math as pure functions on batched tensors (no state, no modules).

Shapes: ``T`` time steps (rollout length), ``N`` envs. Step ``t`` holds the transition
``(o_t, a_t, r_t, o_{t+1})`` with ``done_t`` true when the episode ended at that step (terminated or truncated).

Time-outs: a truncated episode did not really end, so its last reward is bootstrapped with the value of the true
final observation (``info["final_obs"]``), ``r_t <- r_t + γ·V(o_final)``, after which the recursion is cut as
for a termination (the next row of the rollout belongs to a new episode). A terminated episode gets no
bootstrap: the future after a true end is worth zero.
"""

from __future__ import annotations

import torch


def bootstrap_time_outs(reward: torch.Tensor, truncated: torch.Tensor, final_value: torch.Tensor,
                        gamma: float) -> torch.Tensor:
    """Fold the value of a time-out's final observation into its reward.

    r'_t = r_t + γ · V(o_final) · 1[truncated_t]

    Args:
        reward: float [N] (or [T, N]) rewards.
        truncated: bool [N] (or [T, N]); true where the episode hit the time limit (and did not terminate).
        final_value: float [N] (or [T, N]) critic values of the true final observations (any finite value
            where ``truncated`` is false; it is ignored there).
        gamma: discount per step.

    Returns:
        float tensor shaped like ``reward``.
    """
    return reward + gamma * torch.where(truncated, final_value, torch.zeros_like(final_value))


def gae(reward: torch.Tensor, value: torch.Tensor, done: torch.Tensor, last_value: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016) over a rollout.

    δ_t = r_t + γ · V_{t+1} · (1 − done_t) − V_t
    A_t = δ_t + γλ · (1 − done_t) · A_{t+1},     A_T = 0
    R_t = A_t + V_t                                (the value target, a λ-return)

    with ``V_{t+1}`` the value of row ``t+1`` (``last_value`` after the last row). Rewards of time-outs must
    already carry their bootstrap (``bootstrap_time_outs``); ``done`` is ``terminated | truncated``.

    Args:
        reward: float [T, N].
        value: float [T, N], V(o_t) under the critic that collected the rollout.
        done: bool [T, N], the episode ended at step t.
        last_value: float [N], V(o_T) of the observation after the last step.
        gamma: discount per step.
        lam: GAE λ in [0, 1] (0: one-step TD, 1: Monte-Carlo minus baseline).

    Returns:
        (advantages [T, N], returns [T, N]).
    """
    num_steps = reward.shape[0]
    not_done = (~done).to(reward.dtype)
    advantages = torch.zeros_like(reward)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    for t in reversed(range(num_steps)):
        delta = reward[t] + gamma * next_value * not_done[t] - value[t]
        next_adv = delta + gamma * lam * not_done[t] * next_adv
        advantages[t] = next_adv
        next_value = value[t]
    return advantages, advantages + value


def discounted_returns(reward: torch.Tensor, done: torch.Tensor, last_value: torch.Tensor,
                       gamma: float) -> torch.Tensor:
    """Bootstrapped discounted returns, R_t = r_t + γ · (1 − done_t) · R_{t+1}, R_T = V(o_T).

    Equal to ``gae(..., lam=1)`` returns; kept as the reference the GAE test checks against.

    Args:
        reward: float [T, N]; done: bool [T, N]; last_value: float [N].

    Returns:
        float [T, N].
    """
    out = torch.zeros_like(reward)
    running = last_value
    for t in reversed(range(reward.shape[0])):
        running = reward[t] + gamma * (~done[t]).to(reward.dtype) * running
        out[t] = running
    return out


# ------------------------------------------------------------------------------------ off-policy targets
def nstep_targets(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor,
                  gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step return targets from windows of consecutive transitions of one env, cut at episode ends.

    Window row b holds transitions t, t+1, ..., t+n−1 of one env. The window stops at the first step that ends
    the episode (terminated or truncated) and at the first step not yet written (``valid`` false): with m the
    number of steps kept (1 ≤ m ≤ n),

        G_b       = Σ_{k<m} γ^k · r_{t+k}
        discount_b = γ^m · (1 − terminated_{t+m−1})
        target    = G_b + discount_b · Q(o'_{t+m−1}, ·)

    where o'_{t+m−1} is the next observation stored with step t+m−1 (the true final observation where that step
    ended the episode). A termination gets no bootstrap (the future after a true end is worth zero); a time-out
    does (γ^m times the value of the final observation): the two are never merged.

    Args:
        reward: float [B, n], rewards r_{t+k}.
        terminated: bool [B, n].
        truncated: bool [B, n].
        valid: bool [B, n], whether step t+k exists in the buffer (column 0 must be true).
        gamma: discount per env step.

    Returns:
        (G [B], discount [B], last [B] long: m − 1, the column whose next observation bootstraps).
    """
    n = reward.shape[1]
    ended = terminated | truncated
    # Step k is inside the window when every earlier step is valid and did not end the episode.
    blocked = torch.cumsum((ended | ~valid).to(torch.int64), dim=1) - (ended | ~valid).to(torch.int64)
    inside = (blocked == 0) & valid
    steps = inside.sum(dim=1).clamp(min=1)  # m
    powers = gamma ** torch.arange(n, dtype=reward.dtype, device=reward.device)
    ret = (reward * powers * inside.to(reward.dtype)).sum(dim=1)
    last = steps - 1
    last_terminated = terminated.gather(1, last[:, None]).squeeze(1)
    discount = gamma ** steps.to(reward.dtype) * (~last_terminated).to(reward.dtype)
    return ret, discount, last


def categorical_projection(next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                           support: torch.Tensor, next_log_prob: torch.Tensor | None = None,
                           alpha: float | torch.Tensor = 0.0) -> torch.Tensor:
    """C51 projection (Bellemare et al. 2017) of the soft distributional Bellman target onto a fixed support.

    Each atom z_j of the next-state return distribution (probability p_j) moves to

        T z_j = r + d · (z_j − α · log π(a'|o')),    d = γ^n · (1 − terminated)   (``nstep_targets``'s discount)

    clipped to [z_0, z_{K−1}], and its mass is split between the two neighbouring atoms in proportion to the
    distance: with b = (T z_j − z_0) / Δz, l = ⌊b⌋, u = ⌈b⌉,

        m_l += p_j · (u − b),    m_u += p_j · (b − l),    (m_l += p_j when l = u)

    Args:
        next_probs: float [B, K], the target critic's probabilities at (o', a').
        reward: float [B], the (n-step, scaled) reward.
        discount: float [B], γ^n · (1 − terminated).
        support: float [K], evenly spaced atoms z_0 < ... < z_{K−1}.
        next_log_prob: float [B], log π(a'|o') of the next action (None: no entropy term).
        alpha: entropy temperature α.

    Returns:
        float [B, K], the target probabilities (rows sum to the rows of ``next_probs``).
    """
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (support.numel() - 1)
    soft = support[None, :]
    if next_log_prob is not None:
        soft = soft - alpha * next_log_prob[:, None]
    tz = (reward[:, None] + discount[:, None] * soft).clamp(v_min, v_max)
    b = ((tz - v_min) / delta).clamp(0, support.numel() - 1)
    lower, upper = b.floor(), b.ceil()
    w_lower = upper - b + (lower == upper).to(b.dtype)  # an atom landing exactly on z_l keeps all its mass
    w_upper = b - lower
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lower.long(), next_probs * w_lower)
    out.scatter_add_(1, upper.long(), next_probs * w_upper)
    return out
