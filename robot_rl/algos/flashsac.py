"""FlashSAC: soft actor-critic scaled like supervised learning (DESIGN.md §5, the RSS 2026 recipe).

* Networks with bounded weights and features (``policies.modules.flash``): BatchNorm on the input, inverted
  residual blocks, RMSNorm; every linear row back to unit norm after each optimizer step.
* Two distributional critics (C51, 101 bins on [−5, 5]) trained with cross-entropy against the projected soft
  target r + γ^n (1 − terminated)(z − α log π(a'|o')), the target distribution taken from the target critic whose
  expected value is lower. Current and next observations go through the critic in one batch (shared BatchNorm
  statistics), as they do through the actor.
* Rewards divided by max(σ_G, G_max / 5), running statistics of the discounted return G, so returns fit the support.
* Learned temperature (init 0.01) toward the entropy of a Gaussian with σ = 0.15 per action dim,
  ½|A|·log(2πe·0.15²); the actor and temperature every 2nd update; Polyak τ = 0.01; cosine lr 3e-4 → 1.5e-4.
* Exploration: each env holds its noise sample ε for k ~ Zeta(2) steps (capped at 16): a = tanh(μ + σ·ε).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies import keys
from policies.modules.flash import project_to_unit_norm
from policies.tanh_gaussian import TanhGaussianPolicy
from robot_rl import returns
from robot_rl.algos.base import OffPolicyAlgorithm
from robot_rl.algos.guard import NonFiniteGuard
from robot_rl.algos.optim import adam
from robot_rl.buffers.replay import ReplayBuffer, Source, sample_mixed
from robot_rl.distributed import ProcessGroup
from robot_rl.models.q_critics import CategoricalQ


@dataclass
class FlashSACConfig:
    """FlashSAC hyperparameters. The defaults are the paper's GPU recipe (1024 envs, DESIGN.md §5);
    ``configs/algo/flashsac.yaml`` holds the values measured to learn fastest on our CPU envs."""

    batch_size: int = 2048  # B, transitions per gradient update
    updates_per_step: float = 2.0  # gradient updates per vector env step (fractions accumulate: 0.5 = every 2nd)
    buffer_size: int = 10_000_000  # transitions kept, all envs together
    learning_starts: int = 10_000  # transitions collected with uniform random actions before updates begin
    gamma: float = 0.99  # discount per env step
    n_step: int = 1  # env steps summed into each target (3 for locomotion), cut at episode ends
    num_bins: int = 101  # atoms of the critics' return distributions
    v_min: float = -5.0  # lowest atom (scaled-return units)
    v_max: float = 5.0  # highest atom (scaled-return units)
    normalize_reward: bool = True  # divide rewards by max(σ_G, G_max / reward_g_max) (running stats of G)
    reward_g_max: float = 5.0  # |scaled return| bound the scale aims for (match v_max)
    learning_rate: float = 3e-4  # Adam step size at the start (actor, critics, temperature)
    learning_rate_end: float = 1.5e-4  # ... after lr_decay_updates updates (cosine in between)
    lr_decay_updates: int = 200_000  # updates of the cosine schedule; flat at learning_rate_end after
    tau: float = 0.01  # Polyak rate of the target critics: θ' ← θ' + τ(θ − θ')
    actor_update_period: int = 2  # actor and temperature step on every k-th critic update
    init_temperature: float = 0.01  # α at the start
    target_sigma: float = 0.15  # target entropy = ½|A|·log(2πe·σ²) (nats), σ in pre-tanh action units
    noise_zeta_s: float = 2.0  # exploration noise held for k ~ Zeta(s) env steps, P(k) ∝ k^−s
    noise_max_repeat: int = 16  # k capped here (env steps)
    demo_fraction: float = 0.5  # share of each batch from the demo buffer when one is given (RLPD: 0.5)
    amp: bool = False  # bf16 autocast of the forward passes on CUDA (ignored on the CPU)
    compile: bool = False  # torch.compile the networks on CUDA (ignored on the CPU)
    max_grad_norm: float | None = None  # clip the global gradient norm to this (None: no clipping)
    max_consecutive_nonfinite: int = 10  # skipped (NaN/inf) updates in a row before the run stops

    def __post_init__(self) -> None:
        for name in ("batch_size", "buffer_size", "n_step", "actor_update_period", "noise_max_repeat",
                     "lr_decay_updates"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name} must be >= 1, got {getattr(self, name)}")
        if self.updates_per_step <= 0 or self.learning_starts < 0:
            raise ValueError("algo.updates_per_step must be > 0 and algo.learning_starts >= 0")
        if not 0.0 < self.gamma <= 1.0 or not 0.0 < self.tau <= 1.0 or not 0.0 <= self.demo_fraction <= 1.0:
            raise ValueError("need algo.gamma and algo.tau in (0, 1], algo.demo_fraction in [0, 1]")
        if self.init_temperature <= 0 or self.target_sigma <= 0 or self.learning_rate <= 0:
            raise ValueError("algo.init_temperature, algo.target_sigma and algo.learning_rate must be > 0")


def cosine_lr(update: int, start: float, end: float, decay_updates: int) -> float:
    """lr = end + ½(start − end)(1 + cos(π · min(update / decay_updates, 1)))."""
    frac = min(update / decay_updates, 1.0)
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * frac))


def truncated_zeta_probs(s: float, k_max: int) -> torch.Tensor:
    """P(k) = k^−s / Σ_{j ≤ k_max} j^−s for k = 1..k_max: float64 [k_max] (index k − 1)."""
    w = torch.arange(1, k_max + 1, dtype=torch.float64) ** -s
    return w / w.sum()


class RepeatedNoise:
    """Per-env exploration noise ε ~ N(0, I) held for k ~ Zeta(s) steps (capped), redrawn at episode ends."""

    def __init__(self, num_envs: int, action_dim: int, s: float, k_max: int, device: torch.device) -> None:
        self.probs = truncated_zeta_probs(s, k_max).float().to(device)
        self.noise = torch.zeros(num_envs, action_dim, device=device)
        self.left = torch.zeros(num_envs, dtype=torch.long, device=device)  # steps this ε still has

    def sample_repeats(self, n: int) -> torch.Tensor:
        """n draws of k ∈ {1..k_max}, long [n]."""
        return torch.multinomial(self.probs, n, replacement=True) + 1

    def __call__(self) -> torch.Tensor:
        """ε [N, A] for this step (fresh where the previous one ran out).

        Candidates are drawn for every env and selected with ``where``: no host sync on a GPU (a data-dependent
        ``if fresh.any()`` would stall the stream every env step)."""
        fresh = self.left <= 0
        self.noise.copy_(torch.where(fresh[:, None], torch.randn_like(self.noise), self.noise))
        self.left.copy_(torch.where(fresh, self.sample_repeats(self.left.shape[0]), self.left) - 1)
        return self.noise

    def reset(self, done: torch.Tensor, envs: slice | None = None) -> None:
        """Fresh noise at the next step of the envs that ended (``done`` [N], or of the slice ``envs``)."""
        self.left[slice(None) if envs is None else envs][done] = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"noise": self.noise, "left": self.left}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        self.noise.copy_(sd["noise"])
        self.left.copy_(sd["left"])


def explore(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The exploration action tanh(μ + σ·ε) [N, A] for the actor's outputs and held noise ε."""
    return torch.tanh(mean.float() + log_std.float().exp() * eps)


class ReturnScale:
    """Running statistics of each env's discounted return G_t = γ·G_{t−1} + r_t (reset after an episode ends):
    its variance σ_G² (Chan et al.'s parallel merge) and max |G|. ``scale`` = max(σ_G, max|G| / g_max, ε).

    The statistics are float64 scalars on the learner's device, updated without host syncs."""

    def __init__(self, num_envs: int, gamma: float, g_max: float, device: torch.device) -> None:
        self.gamma, self.g_max = gamma, g_max
        self.g = torch.zeros(num_envs, dtype=torch.float64, device=device)
        zero = torch.zeros((), dtype=torch.float64, device=device)
        self.count, self.mean, self.m2, self.abs_max = zero.clone(), zero.clone(), zero.clone(), zero.clone()

    def update(self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
               envs: slice | None = None) -> None:
        """One step of the envs ``envs`` (default: all; a remote learner's actor owns a slice of them)."""
        sl = slice(None) if envs is None else envs
        g_all = self.gamma * self.g[sl] + reward.double()
        finite = torch.isfinite(g_all)
        n_b = finite.sum().double()
        g = torch.where(finite, g_all, 0.0)
        mean_b = g.sum() / n_b.clamp_min(1.0)
        m2_b = torch.where(finite, (g - mean_b) ** 2, 0.0).sum()
        total = self.count + n_b
        delta = mean_b - self.mean
        any_b = n_b > 0  # a batch with no finite return leaves the statistics as they were
        self.mean = torch.where(any_b, self.mean + delta * n_b / total.clamp_min(1.0), self.mean)
        self.m2 = torch.where(any_b, self.m2 + m2_b + delta**2 * self.count * n_b / total.clamp_min(1.0), self.m2)
        self.count = total
        self.abs_max = torch.maximum(self.abs_max, g.abs().max())
        self.g[sl] = torch.where(terminated | truncated | ~finite, 0.0, g_all)

    def scale(self) -> torch.Tensor:
        """float64 [] divisor of rewards (1 before any statistics)."""
        std = torch.sqrt(self.m2 / self.count.clamp_min(1.0))
        s = torch.maximum(torch.maximum(std, self.abs_max / self.g_max), torch.full_like(std, 1e-8))
        return torch.where(self.count > 0, s, torch.ones_like(s))

    def state_dict(self) -> dict[str, Any]:
        return {"g": self.g, "count": self.count, "mean": self.mean, "m2": self.m2, "abs_max": self.abs_max}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.g.copy_(sd["g"])
        for k in ("count", "mean", "m2", "abs_max"):  # tensors, or Python floats in older checkpoints
            setattr(self, k, torch.as_tensor(sd[k], dtype=torch.float64).to(self.g.device).clone())


class FlashSAC(OffPolicyAlgorithm):
    """The learner. ``act`` during collection, ``update(replay)`` for one gradient update; never steps an env.

    Args:
        actor: the tanh-Gaussian policy (exported alone for deployment).
        critic: the distributional Q ensemble (a target copy is made here).
        cfg: hyperparameters.
        num_envs: N, for the per-env exploration noise and return statistics.
        device: where the networks live.
    """

    name = "flashsac"
    rank_state_keys = ("noise", "return_scale")  # per env: each data-parallel rank's own

    def __init__(self, actor: TanhGaussianPolicy, critic: CategoricalQ, cfg: FlashSACConfig, num_envs: int,
                 device: torch.device | str = "cpu") -> None:
        self.cfg, self.device, self.num_envs = cfg, torch.device(device), num_envs
        if (critic.cfg.num_bins, critic.cfg.v_min, critic.cfg.v_max) != (cfg.num_bins, cfg.v_min, cfg.v_max):
            raise ValueError("critic support (num_bins, v_min, v_max) differs from algo's")
        self.actor = actor.to(self.device)
        self.critic = critic.to(self.device)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_temperature), device=self.device, requires_grad=True)
        a = actor.cfg.action_dim
        self.target_entropy = 0.5 * a * math.log(2 * math.pi * math.e * cfg.target_sigma**2)
        # fused where the device has the kernel (robot_rl/algos/optim.py): on so101_lift an update took 13.2 ms against
        # foreach's 14.6 ms (six alternated rounds of 20 updates, 2026-12-06)
        self.actor_opt = adam(self.actor.parameters(), cfg.learning_rate, self.device)
        self.critic_opt = adam(self.critic.parameters(), cfg.learning_rate, self.device)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.learning_rate)
        self.noise = RepeatedNoise(num_envs, a, cfg.noise_zeta_s, cfg.noise_max_repeat, self.device)
        self.return_scale = ReturnScale(num_envs, cfg.gamma, cfg.reward_g_max, self.device)
        # One guard per learner so a healthy actor step never hides a critic that keeps failing (and vice versa).
        self.guard = NonFiniteGuard(cfg.max_consecutive_nonfinite)  # critic updates (and poisoned batches)
        self.actor_guard = NonFiniteGuard(cfg.max_consecutive_nonfinite)  # actor and temperature updates
        self.num_updates = 0
        cuda = self.device.type == "cuda"
        self.amp = cfg.amp and cuda
        compile_ = torch.compile if cfg.compile and cuda else (lambda f: f)
        # Compiled call paths; state dicts always come from the plain modules.
        self._actor_fwd, self._actor_sample = compile_(self.actor), compile_(self.actor.sample)
        self._critic, self._target = compile_(self.critic), compile_(self.target)
        self.group: ProcessGroup | None = None  # data-parallel ranks (``distribute``); None: this process alone

    def distribute(self, group: ProcessGroup) -> None:
        """Rank 0's networks, target and temperature on every rank; from now on every critic, actor and temperature
        step averages the ranks' gradients and losses, and the BatchNorm statistics each rank's forward pass moved,
        in one all-reduce per step; a batch with a non-finite value on any rank skips the update on all. Each rank
        keeps its own envs' exploration noise and reward-scale statistics (``rank_state_keys``): the reward scale
        is each rank's estimate of the same return spread."""
        group.broadcast_([t for m in (self.actor, self.critic, self.target) for t in (*m.parameters(), *m.buffers())]
                         + [self.log_alpha.data])
        self.group = group

    @property
    def policy(self) -> TanhGaussianPolicy:
        """What ships (the runner exports it with every checkpoint)."""
        return self.actor

    @property
    def obs_groups(self) -> list[str]:
        return sorted({self.actor.cfg.obs_key, self.critic.cfg.obs_key})

    @property
    def replay_capacity(self) -> int:
        return self.cfg.buffer_size

    @property
    def learning_starts(self) -> int:
        return self.cfg.learning_starts

    @property
    def updates_per_step(self) -> float:
        return self.cfg.updates_per_step

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def train_mode(self) -> None:
        self.actor.train()
        self.critic.train()

    def eval_mode(self) -> None:
        self.actor.eval()
        self.critic.eval()

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp)

    # ------------------------------------------------------------------------------------------- collection
    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Exploration actions [N, A] = tanh(μ + σ·ε) with each env's held noise ε (BatchNorm on running stats)."""
        self.actor.eval()
        with self._autocast():
            mean, log_std = self._actor_fwd(obs)
        return explore(mean, log_std, self.noise())

    def random_action(self, num_envs: int) -> torch.Tensor:
        """Uniform actions in [-1, 1]^A, for the first ``learning_starts`` transitions."""
        return torch.rand(num_envs, self.actor.cfg.action_dim, device=self.device) * 2.0 - 1.0

    def observe(self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                envs: slice | None = None) -> None:
        """After each env step (of the envs ``envs``; default all): return statistics for the reward scale; fresh
        noise for new episodes."""
        if self.cfg.normalize_reward:
            self.return_scale.update(reward, terminated, truncated, envs)
        self.noise.reset(terminated | truncated, envs)

    def set_num_envs(self, num_envs: int) -> None:
        """Per-env state (exploration noise, return statistics) for ``num_envs`` envs, before training starts: a
        remote learner (``robot_rl.remote``) sees every actor's envs."""
        self.num_envs = num_envs
        self.noise = RepeatedNoise(num_envs, self.actor.cfg.action_dim, self.cfg.noise_zeta_s,
                                   self.cfg.noise_max_repeat, self.device)
        self.return_scale = ReturnScale(num_envs, self.cfg.gamma, self.cfg.reward_g_max, self.device)

    # ----------------------------------------------------------------------------------------------- update
    def update(self, replay: ReplayBuffer, demo: Source | None = None) -> dict[str, float | torch.Tensor]:
        """One critic update (and, every ``actor_update_period``-th call, an actor and temperature update).

        Returns statistics as floats or 0-dim device tensors (no ``.item()`` here: the runner converts them once
        per iteration, so a GPU learner is not stalled by a host sync after every step)."""
        cfg = self.cfg
        batch = sample_mixed(replay, demo, cfg.batch_size, cfg.demo_fraction, cfg.n_step, cfg.gamma)
        obs, next_obs = batch[keys.OBS], batch[keys.NEXT_OBS]
        inputs = [*obs.values(), *next_obs.values(), batch[keys.ACTION], batch[keys.REWARD]]
        floats = [x for x in inputs if x.is_floating_point()]
        finite = bool(torch.stack([torch.isfinite(x).all() for x in floats]).all())  # one host sync
        if self.group is not None:  # a poisoned batch on any rank: every rank skips (their updates stay one)
            finite = not self.group.any_(not finite)
        if not finite:
            self.guard.record(False)  # counts the skip (raises past the limit); a poisoned batch never reaches BN
            return {"nonfinite_skips": self.nonfinite_skips}
        scale = self.return_scale.scale() if cfg.normalize_reward else 1.0
        reward = batch[keys.REWARD] / scale
        stats: dict[str, float | torch.Tensor] = {}  # 0-dim tensors stay on the device until the runner logs
        if self.num_updates % cfg.actor_update_period == 0:
            stats.update(self._update_actor(obs, next_obs))
        critic_stats = self._update_critic(obs, batch[keys.ACTION], reward, batch["discount"], next_obs)
        if critic_stats:  # a skipped critic step is no update: the schedule does not advance
            self.num_updates += 1
        stats.update(critic_stats)
        stats.update(learning_rate=self.learning_rate, reward_scale=scale, alpha=self.alpha.detach(),
                     nonfinite_skips=self.nonfinite_skips)
        return stats

    @property
    def nonfinite_skips(self) -> float:
        return float(self.guard.skipped + self.actor_guard.skipped)

    @property
    def learning_rate(self) -> float:
        """The cosine schedule's value at the current update count."""
        c = self.cfg
        return cosine_lr(self.num_updates, c.learning_rate, c.learning_rate_end, c.lr_decay_updates)

    def _set_lr(self, opt: torch.optim.Optimizer) -> None:
        for group in opt.param_groups:
            group["lr"] = self.learning_rate

    def _step(self, opt: torch.optim.Optimizer, loss: torch.Tensor, module: nn.Module,
              saved: list[tuple[torch.Tensor, torch.Tensor]], guard: NonFiniteGuard) -> torch.Tensor | None:
        """Backward, guard, step, project ``module`` back to unit norms. A non-finite loss or gradient skips the
        step: optimizer state untouched, BatchNorm statistics restored from ``saved``. Returns the gradient norm,
        or None when skipped."""
        params = list(module.parameters())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.group is not None:  # the ranks' gradients, losses and BatchNorm statistics averaged
            loss = self.group.average_gradients(params, loss.detach().reshape(1), [b for b, _ in saved])[0]
        grads = [p.grad for p in params if p.grad is not None]
        if self.cfg.max_grad_norm is not None:
            norm = nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        else:
            norm = nn.utils.get_total_norm(grads)
        if not guard.check(loss, norm):
            opt.zero_grad(set_to_none=True)
            for buf, copy_ in saved:
                buf.copy_(copy_)
            return None
        self._set_lr(opt)  # only now: a skipped step leaves every optimizer field (lr included) as it was
        opt.step()
        project_to_unit_norm(module)
        return norm.detach()

    @staticmethod
    def _save_buffers(*modules: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(buffer, copy) of the BatchNorm statistics a training-mode forward is about to change."""
        return [(b, b.clone()) for m in modules for b in m.buffers()]

    def _update_actor(self, obs: dict[str, torch.Tensor],
                      next_obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # L_π = E[α·log π(a|o) − min_i Q_i(o, a)], a ~ π(·|o); o and o' in one batch (shared BN statistics)
        b = next(iter(obs.values())).shape[0]
        key = self.actor.cfg.obs_key
        self.actor.train()
        self.critic.eval()
        self.critic.requires_grad_(False)
        saved = self._save_buffers(self.actor)
        with self._autocast():
            action, log_prob = self._actor_sample(torch.cat([obs[key], next_obs[key]]))
            action, log_prob = action[:b], log_prob[:b].float()
            q = self.critic.expectation(self._critic(obs, action))
        self.critic.requires_grad_(True)
        self.critic.train()
        loss = (self.alpha * log_prob - q.min(dim=0).values).mean()
        norm = self._step(self.actor_opt, loss, self.actor, saved, self.actor_guard)
        if norm is None:
            return {}
        # L_α = α · (H − H_target), H = −E[log π]: α falls while the policy is more random than the target
        entropy = -log_prob.detach().mean()
        alpha_loss = self.log_alpha.exp() * (entropy - self.target_entropy)
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        checked = alpha_loss.detach()
        if self.group is not None:
            checked = self.group.average_gradients([self.log_alpha], checked.reshape(1))[0]
        if self.actor_guard.check(checked, self.log_alpha.grad):
            self._set_lr(self.alpha_opt)
            self.alpha_opt.step()
        return {"loss/actor": loss.detach(), "loss/temperature": alpha_loss.detach(), "entropy": entropy,
                "grad_norm/actor": norm}

    def _update_critic(self, obs: dict[str, torch.Tensor], action: torch.Tensor, reward: torch.Tensor,
                       discount: torch.Tensor, next_obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b = action.shape[0]
        both = {k: torch.cat([obs[k], next_obs[k]]) for k in obs}
        saved = self._save_buffers(self.critic, self.target)
        self.target.train()  # batch statistics of the joint (o, a) / (o', a') batch, as the online critic sees
        with torch.no_grad():
            self.actor.eval()
            with self._autocast():
                next_action, next_log_prob = self._actor_sample(next_obs[self.actor.cfg.obs_key])
            next_action = next_action.float()
            actions = torch.cat([action, next_action])
            with self._autocast():
                target_logits = self._target(both, actions)[:, b:].float()  # [Q, B, K], batch statistics
            probs = torch.softmax(target_logits, dim=-1)
            lower = (probs * self.critic.support).sum(-1).argmin(dim=0)  # the critic with the lower E[Z]
            next_probs = probs[lower, torch.arange(b, device=self.device)]
            target = returns.categorical_projection(next_probs, reward, discount, self.critic.support,
                                                    next_log_prob.float(), self.alpha)
        # L_Z = −Σ_i Σ_j target_j · log p_ij(o, a), averaged over the batch and the ensemble
        with self._autocast():
            logits = self._critic(both, actions)[:, :b].float()
        loss = -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        norm = self._step(self.critic_opt, loss, self.critic, saved, self.guard)
        if norm is None:
            return {}
        with torch.no_grad():
            torch._foreach_lerp_(list(self.target.parameters()), list(self.critic.parameters()), self.cfg.tau)
            q = self.critic.expectation(logits.detach()).mean()
        return {"loss/critic": loss.detach(), "q_mean_scaled": q, "grad_norm/critic": norm}

    # -------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bitwise: networks, targets, temperature, optimizers, noise, return
        statistics, guard counters, update count."""
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "target": self.target.state_dict(), "log_alpha": self.log_alpha.detach(),
                "actor_opt": self.actor_opt.state_dict(), "critic_opt": self.critic_opt.state_dict(),
                "alpha_opt": self.alpha_opt.state_dict(), "noise": self.noise.state_dict(),
                "return_scale": self.return_scale.state_dict(), "guard": self.guard.state_dict(),
                "actor_guard": self.actor_guard.state_dict(),
                "num_updates": self.num_updates, "cfg": asdict(self.cfg)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.actor.load_state_dict(sd["actor"])
        self.critic.load_state_dict(sd["critic"])
        self.target.load_state_dict(sd["target"])
        with torch.no_grad():
            self.log_alpha.copy_(sd["log_alpha"])
        self.actor_opt.load_state_dict(sd["actor_opt"])
        self.critic_opt.load_state_dict(sd["critic_opt"])
        self.alpha_opt.load_state_dict(sd["alpha_opt"])
        self.noise.load_state_dict(sd["noise"])
        self.return_scale.load_state_dict(sd["return_scale"])
        self.guard.load_state_dict(sd["guard"])
        self.actor_guard.load_state_dict(sd["actor_guard"])
        self.num_updates = int(sd["num_updates"])
