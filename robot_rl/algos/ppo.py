"""Proximal policy optimization, the rsl_rl / Isaac Lab recipe (DESIGN.md §5).

Clipped surrogate (Schulman et al. 2017) and clipped value loss, an entropy bonus, GAE with time-out
bootstrapping, one Adam over actor and critic with an adaptive-KL learning rate, gradient-norm clipping,
epochs × minibatches over each rollout. Asymmetric: the actor reads the ``policy`` observation group, the critic
the ``critic`` group. Empirical observation normalizers live inside the actor (exported with it) and the critic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from policies.gaussian import GaussianPolicy, normal_entropy, normal_log_prob
from policies.normalizer import EmpiricalNormalizer
from robot_rl import returns
from robot_rl.algos.base import OnPolicyAlgorithm
from robot_rl.algos.guard import NonFiniteGuard
from robot_rl.algos.optim import adam
from robot_rl.algos.precision import bf16_autocast, check_bf16_setting, resolve_bf16
from robot_rl.buffers.rollout import RolloutBuffer
from robot_rl.distributed import ProcessGroup
from robot_rl.models.critics import MLPCritic

SCHEDULES = ("adaptive", "fixed")


@dataclass
class PPOConfig:
    """PPO hyperparameters (rsl_rl defaults). Scale the number of envs, not these, for smaller machines."""

    num_epochs: int = 5  # passes over each rollout
    num_minibatches: int = 4  # minibatches per pass; batch size = T·N / num_minibatches samples
    gamma: float = 0.99  # discount per env step
    lam: float = 0.95  # GAE λ
    clip: float = 0.2  # surrogate ratio clip ε: ratio kept in [1 − ε, 1 + ε]
    value_clip: float = 0.2  # value change clip around the collecting critic's value (return units)
    # Max of clipped and unclipped squared errors (rsl_rl's; else plain MSE, SB3's). so101_lift (returns in the
    # hundreds), 256 envs, seeds 0-2, env steps to 90 %: clipped 3.05, 2.89, 5.55 M; unclipped 7.46, 1.75, 1.27 M
    # (median 3.05 -> 1.75 M), so so101_lift's recipe turns it off (configs/algo_task/ppo_so101_lift.yaml).
    use_clipped_value_loss: bool = True
    # Value targets normalised by running statistics of the returns: the critic predicts (R − μ_R) / σ_R, so the value
    # clip and loss are in σ units whatever the task's return scale (so101_lift's returns are in the hundreds). Off:
    # on so101_lift (256 envs, seed 0) it had no success after 3.15 M env steps (the default reached 90 % at 3.05 M),
    # and so101_reach took 58.4 k env steps to 90 % with it vs 47.6 k without.
    normalize_value: bool = False
    value_coef: float = 1.0  # weight of the value loss
    entropy_coef: float = 0.01  # weight of the entropy bonus (nats)
    learning_rate: float = 1e-3  # Adam step size at the start (the adaptive schedule changes it)
    # "adaptive" (KL-driven lr, rsl_rl's) or "fixed" (SB3's). so101_reach's recipe is fixed: over 30 seeds a median
    # 43.0 k env steps to 90 % vs 47.6 k (configs/algo_task/ppo_so101_reach.yaml).
    schedule: str = "adaptive"
    desired_kl: float = 0.01  # target KL(π_old‖π_new) per sample (nats) for the adaptive schedule
    lr_factor: float = 1.5  # lr ÷ factor when KL > 2·target, × factor when KL < target / 2
    lr_min: float = 1e-5  # clamp of the adaptive lr
    lr_max: float = 1e-2  # clamp of the adaptive lr
    max_grad_norm: float = 1.0  # global L2 norm gradients are clipped to
    normalize_advantages: bool = True  # advantages to zero mean, unit std over each rollout
    max_consecutive_nonfinite: int = 10  # skipped (NaN/inf) updates in a row before the run stops
    # bf16 autocast of the update's forward pass: the hidden layers' matrix products and their gradients in bf16;
    # weights, gradients, Adam, the output layers (policies.mlp.OutputLinear), the losses and collection stay float32.
    # true (refused where bf16 would be emulated), false, or "auto": where the hardware computes bf16 natively
    # (robot_rl.algos.precision). so101_reach's and so101_lift's recipes use "auto" (configs/algo_task/).
    bf16: bool | str = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"algo.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        for name in ("num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"algo.gamma must be in (0, 1] and algo.lam in [0, 1], got {self.gamma}, {self.lam}")
        if self.clip <= 0 or self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("algo.clip, algo.learning_rate and algo.max_grad_norm must be > 0")
        check_bf16_setting(self.bf16, "algo.bf16")
        if not 0 < self.lr_min <= self.lr_max:
            raise ValueError(f"need 0 < algo.lr_min <= algo.lr_max, got {self.lr_min}, {self.lr_max}")


def gaussian_kl(mu_old: torch.Tensor, std_old: torch.Tensor, mu_new: torch.Tensor,
                std_new: torch.Tensor) -> torch.Tensor:
    """KL(N_old ‖ N_new) per sample [B], summed over action dims:
    Σ log(σ_new/σ_old) + (σ_old² + (μ_old − μ_new)²) / (2σ_new²) − ½."""
    return torch.sum(torch.log(std_new / std_old) + (std_old**2 + (mu_old - mu_new) ** 2) / (2 * std_new**2) - 0.5,
                     dim=-1)


class PPO(OnPolicyAlgorithm):
    """The learner. ``act`` during collection, ``update(buffer)`` after each rollout; never steps an env.

    Args:
        policy: the actor (exported alone for deployment).
        critic: the state-value critic (asymmetric: may read privileged observations).
        cfg: hyperparameters.
        device: where the networks (and the rollout buffer) live.
    """

    name = "ppo"

    def __init__(self, policy: GaussianPolicy, critic: MLPCritic, cfg: PPOConfig,
                 device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.bf16 = resolve_bf16(cfg.bf16, self.device, "algo.bf16")  # what the update computes in
        self.policy = policy.to(self.device)
        self.critic = critic.to(self.device)
        self.params = [*self.policy.parameters(), *self.critic.parameters()]
        # fused: one kernel over all 16 parameter tensors per minibatch instead of foreach's dozen list ops and its host
        # reads of each tensor's step count (34 per minibatch, counted); the update 0.89x foreach's time (optim.py).
        self.optimizer = adam(self.params, cfg.learning_rate, self.device)
        self.guard = NonFiniteGuard(cfg.max_consecutive_nonfinite)
        # Running mean / variance of the returns (cfg.normalize_value); identity statistics until the first update.
        self.return_norm = EmpiricalNormalizer((), clip=1e6).to(self.device)
        self.group: ProcessGroup | None = None  # data-parallel ranks (``distribute``); None: this process alone

    def distribute(self, group: ProcessGroup) -> None:
        """Rank 0's weights and statistics on every rank; from now on each minibatch's gradients, KL and losses are
        averaged over the ranks (the KL that steers the adaptive learning rate is all ranks' mean, so every rank
        keeps the same rate), the advantages normalised by all ranks' statistics, and the observation and return
        normalisers merging every rank's batches: the observations once per rollout (``finish_rollout``; acting, each
        rank holds the statistics as of the last rollout, where one process merges every step), the returns at
        each update."""
        modules = (self.policy, self.critic, self.return_norm)
        group.broadcast_([t for m in modules for t in (*m.parameters(), *m.buffers())])
        for m in modules:
            for norm in m.modules():
                if isinstance(norm, EmpiricalNormalizer):
                    norm.reduce = group.sum_
        self.group = group

    @property
    def obs_groups(self) -> list[str]:
        return list(dict.fromkeys([self.policy.cfg.obs_key, self.critic.cfg.obs_key]))

    @property
    def rollout_fields(self) -> dict[str, tuple[int, ...]]:
        a = self.policy.cfg.action_dim
        return {"log_prob": (), "value": (), "mean": (a,), "std": (a,)}

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def train_mode(self) -> None:
        self.policy.train()
        self.critic.train()

    def eval_mode(self) -> None:
        self.policy.eval()
        self.critic.eval()

    # ------------------------------------------------------------------------------------------- collection
    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sampled actions [N, A] (unclipped; the env clips to [-1, 1]) and what the update needs of them:
        log π(a|o) [N] summed over action dims, V(o) [N], μ and σ [N, A]. Normalisers are updated first (in
        training mode)."""
        self.policy.update_normalizer(obs)
        self.critic.update_normalizer(obs)
        mean, std = self.policy.mean_std(obs)
        action = torch.normal(mean, std)  # the draw Normal(mean, std).sample() makes: the same random stream
        return action, {"log_prob": normal_log_prob(action, mean, std), "value": self.value(obs), "mean": mean,
                        "std": std}

    @torch.no_grad()
    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(o) [N] in return units (the critic's output denormalised when ``cfg.normalize_value``)."""
        v = self.critic(obs)
        return self.return_norm.inverse(v) if self.cfg.normalize_value else v

    @torch.no_grad()
    def bootstrap_time_outs(self, reward: torch.Tensor, truncated: torch.Tensor,
                            final_obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """r + γ·V(final_obs) where the episode timed out (terminations are never bootstrapped)."""
        if not bool(truncated.any()):
            return reward
        return returns.bootstrap_time_outs(reward, truncated, self.value(final_obs), self.cfg.gamma)

    @torch.no_grad()
    def finish_rollout(self, buffer: RolloutBuffer, last_obs: dict[str, torch.Tensor]) -> None:
        """GAE over the full buffer: advantages and returns [T, N] from the stored values and V(o_T). A step where
        the env faulted (``buffer.valid`` False) gets r_t = V(o_t): its TD error is 0 (it is done), so it adds
        nothing, and the steps before it bootstrap from V(o_t) as from a time-out, instead of learning that the
        episode ended with reward 0 (RELIABILITY D1); ``update`` gives it no weight."""
        self._sync_normalizers(self.policy, self.critic)  # data-parallel: the ranks' observations of the rollout
        values = buffer.extras["value"]
        if buffer.has_invalid():
            buffer.reward.copy_(torch.where(buffer.valid, buffer.reward, values))
        buffer.compute_returns(values, self.value(last_obs), self.cfg.gamma, self.cfg.lam)

    # ----------------------------------------------------------------------------------------------- update
    def update(self, buffer: RolloutBuffer) -> dict[str, float]:
        """Epochs × minibatches of clipped PPO on a full buffer with returns computed. Returns mean stats."""
        cfg = self.cfg
        if cfg.normalize_value:  # statistics of this rollout's returns join before its targets are normalised
            self.return_norm.train()
            self.return_norm.update(buffer.returns.flatten())
            self._sync_normalizers(self.return_norm)
        if cfg.normalize_advantages and self.group is not None:
            self._normalize_advantages_over_ranks(buffer)
        elif cfg.normalize_advantages:
            adv = buffer.advantages
            if buffer.has_invalid():  # statistics of the valid steps only
                ok = adv[buffer.valid]
                adv.copy_(torch.where(buffer.valid, (adv - ok.mean()) / (ok.std() + 1e-8), 0.0))
            else:
                adv.copy_((adv - adv.mean()) / (adv.std() + 1e-8))
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(cfg.num_epochs):
            for batch in buffer.minibatches(cfg.num_minibatches):
                stats = self._step(batch)
                steps += 1
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        out = {k: v / max(steps, 1) for k, v in totals.items()}
        out.update(learning_rate=self.learning_rate, nonfinite_skips=float(self.guard.skipped),
                   action_std=self.policy.log_std.detach().exp().mean().item())
        return out

    def _sync_normalizers(self, *modules: nn.Module) -> None:
        """Data-parallel: the running statistics in ``modules`` merge every rank's batches since their last sync
        (once per rollout, not per step: an all-reduce took ~1.4 ms between two processes on 2 cores)."""
        if self.group is None:
            return
        for m in modules:
            for norm in m.modules():
                if isinstance(norm, EmpiricalNormalizer):
                    norm.sync()

    def _normalize_advantages_over_ranks(self, buffer: RolloutBuffer) -> None:
        """Advantages to zero mean and unit (unbiased) std over every rank's valid steps: their counts, sums and sums
        of squares summed over the ranks in float64."""
        adv = buffer.advantages
        valid = buffer.valid if buffer.has_invalid() else torch.ones_like(adv, dtype=torch.bool)
        a = adv[valid].double()
        n, total, squares = self.group.sum_(torch.stack([a.new_tensor(float(a.numel())), a.sum(), (a * a).sum()]))
        mean = total / n
        std = ((squares - n * mean**2) / (n - 1).clamp(min=1.0)).clamp(min=0.0).sqrt()
        adv.copy_(torch.where(valid, (adv - mean.float()) / (std.float() + 1e-8), 0.0))

    def _step(self, batch: dict[str, Any]) -> dict[str, float]:
        cfg = self.cfg
        obs, adv, ret = batch["obs"], batch["advantages"], batch["returns"]
        with bf16_autocast(self.bf16, self.device):  # the output layers (OutputLinear) give float32 either way
            mean, std = self.policy.mean_std(obs)
            value = self.critic(obs)
        old_value = batch["value"]
        log_prob = normal_log_prob(batch["action"], mean, std)
        weight = batch.get("weight")  # 0 where the env faulted; absent when no step of the rollout did
        avg = torch.mean if weight is None else (lambda x: (x * weight).sum() / weight.sum().clamp(min=1.0))
        entropy = avg(normal_entropy(std))
        if cfg.normalize_value:  # the loss in σ units: targets and the collecting values normalised alike
            ret, old_value = self.return_norm(ret), self.return_norm(old_value)

        # L_clip = E[max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε))],  ρ = π(a|o) / π_old(a|o)
        ratio = torch.exp(log_prob - batch["log_prob"])
        surrogate = avg(torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)))
        # L_V = E[max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²)]
        if cfg.use_clipped_value_loss:
            v_clipped = old_value + (value - old_value).clamp(-cfg.value_clip, cfg.value_clip)
            value_loss = avg(torch.max((value - ret) ** 2, (v_clipped - ret) ** 2))
        else:
            value_loss = avg((value - ret) ** 2)
        loss = surrogate + cfg.value_coef * value_loss - cfg.entropy_coef * entropy

        with torch.no_grad():
            kl = avg(gaussian_kl(batch["mean"], batch["std"], mean, std))
            clip_frac = avg(((ratio - 1.0).abs() > cfg.clip).float())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        scalars = torch.stack([loss.detach(), surrogate.detach(), value_loss.detach(), entropy.detach(), kl,
                               clip_frac])
        if self.group is not None:  # one all-reduce: the ranks' gradients and scalars averaged (a NaN anywhere
            scalars = self.group.average_gradients(self.params, scalars)  # reaches every rank: all skip alike)
        grad_norm = nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        # One host read for the guard, the schedule and the logs (the guard's own check and six .item() calls were
        # ~15 dispatched ops of the ~300 per minibatch).
        loss_v, surrogate_v, value_loss_v, entropy_v, kl_v, clip_frac_v, grad_norm_v = (
            torch.cat([scalars, grad_norm.detach().reshape(1)]).tolist())
        if not self.guard.record(math.isfinite(loss_v) and math.isfinite(grad_norm_v)):
            self.optimizer.zero_grad(set_to_none=True)  # optimizer state (moments, step, lr) untouched
            return {}
        if cfg.schedule == "adaptive" and math.isfinite(kl_v):
            lr = self.learning_rate
            if kl_v > 2.0 * cfg.desired_kl:
                lr = max(cfg.lr_min, lr / cfg.lr_factor)
            elif 0.0 < kl_v < 0.5 * cfg.desired_kl:
                lr = min(cfg.lr_max, lr * cfg.lr_factor)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.optimizer.step()
        return {"loss/surrogate": surrogate_v, "loss/value": value_loss_v, "loss/entropy": entropy_v, "kl": kl_v,
                "grad_norm": grad_norm_v, "clip_fraction": clip_frac_v}

    # -------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bitwise: networks (with normalizers), optimizer, guard counters."""
        return {"policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
                "optimizer": self.optimizer.state_dict(), "guard": self.guard.state_dict(),
                "return_norm": self.return_norm.state_dict(), "cfg": asdict(self.cfg)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.policy.load_state_dict(sd["policy"])
        self.critic.load_state_dict(sd["critic"])
        self.optimizer.load_state_dict(sd["optimizer"])
        self.guard.load_state_dict(sd["guard"])
        if "return_norm" in sd:  # absent from checkpoints written before value normalisation existed
            self.return_norm.load_state_dict(sd["return_norm"])
