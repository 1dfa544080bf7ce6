"""FlowVLAPolicy: a multi-task image + language + proprio policy whose action expert samples chunks by flow matching.

Frames follow LeRobot's convention (``policies.keys``): ``observation.state`` float [N, P] degrees,
``observation.images.<camera>`` uint8 [N, 3, H, W] (sim, robot) or float [0, 1] (datasets), ``task`` list[str].
Actions are joint position targets in degrees, chunks [N, H, A]. Normalisation: the state through the processor
(dataset mean/std), the actions by the ``action_mean`` / ``action_std`` buffers saved with the weights, or, with
``cfg.relative_actions``, the chunk minus the frame's joints by ``delta_mean`` / ``delta_std`` [H, A]; images are
scaled to [-1, 1]. No privileged simulator state is read.

Sampling (``act``): x_1 = ε (when ``deterministic``, fixed draws ε* from ``cfg.noise_seed`` for every env: the
same chunk for the same frame, whatever the batch it is in; fresh N(0, I) otherwise; or the ``noise`` given), then
``cfg.num_steps`` Euler steps to t = 0 (``policies.flow_vla.flow``); the action is the mean (or, by
``cfg.sample_reduction``, the median or the medoid; the dimensions of ``cfg.median_actions`` the median) of
``cfg.mean_of_samples`` such chunks per frame (one when ``noise`` is given). With conditioning, the indicator of
each frame (``CONDITION_KEY``; 1 when absent) conditions v_c, and v = v_u + β (v_c − v_u) with β =
``cfg.guidance_beta``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from policies import keys
from policies.base import Policy
from policies.flow_vla.config import CONDITION_KEY, RELATIVE_STATS_KEY, FlowVLAConfig, task_key
from policies.flow_vla.encoders import (
    build_vocab,
    color_jitter,
    random_shift,
    split_words,
    to_unit_range,
    tokenize,
    word_index,
)
from policies.flow_vla.flow import (
    euler_integrate,
    euler_times,
    flow_matching_loss,
    guided_velocity,
    interpolate,
    reduce_samples,
    sample_time,
    target_velocity,
)
from policies.flow_vla.model import COND_NEGATIVE, COND_NONE, COND_POSITIVE, FlowVLAModel
from policies.normalizer import EmpiricalNormalizer
from policies.processor import Features, Processor

Stats = Mapping[str, Mapping[str, Any]]  # feature -> {"mean", "std", "min", "max", ("count")}: tensors, arrays, lists


def default_processor(cfg: FlowVLAConfig, state_names: list[str] | None = None,
                      action_names: list[str] | None = None) -> Processor:
    """The VLA's processor: the state [P] (normalised) and one image group [3, H, W] per camera."""
    inputs = {keys.OBS_STATE: [cfg.state_dim]} | {keys.lerobot_image_key(c): [3, *cfg.image_size] for c in cfg.cameras}
    features = Features(inputs=inputs, action_dim=cfg.action_dim,
                        names={keys.OBS_STATE: list(state_names)} if state_names else {},
                        action_names=list(action_names or []))
    return Processor(features, [keys.OBS_STATE])


class FlowVLAPolicy(Policy):
    """π(chunk | images, task, state): flow matching over normalised action chunks [H, A].

    Args:
        cfg: architecture, vocabulary, sampling settings.
        processor: features and the state normaliser (default: ``default_processor(cfg)``, identity statistics
            until ``set_stats``).
    """

    type_name = "flow_vla"
    config_class = FlowVLAConfig

    def __init__(self, cfg: FlowVLAConfig, processor: Processor | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.processor = processor or default_processor(cfg)
        want = default_processor(cfg).features
        got = self.processor.features
        if got.inputs != want.inputs or got.action_dim != want.action_dim:
            raise ValueError(f"processor features {got.inputs} (action_dim {got.action_dim}) do not fit the config "
                             f"{want.inputs} (action_dim {want.action_dim})")
        self.model = FlowVLAModel(cfg)
        self.register_buffer("action_mean", torch.zeros(cfg.action_dim))  # degrees
        self.register_buffer("action_std", torch.ones(cfg.action_dim))  # degrees
        self.register_buffer("delta_mean", torch.zeros(cfg.horizon, cfg.action_dim))  # degrees, a_h - q per step h
        self.register_buffer("delta_std", torch.ones(cfg.horizon, cfg.action_dim))  # degrees
        self._word_ids = word_index(cfg.vocab)

    @classmethod
    def from_stats(cls, stats: Stats, tasks: list[str], cfg: FlowVLAConfig | None = None,
                   state_names: list[str] | None = None, action_names: list[str] | None = None) -> FlowVLAPolicy:
        """A fresh policy for a dataset: the vocabulary of its ``tasks`` in the config, and its statistics set.

        Args:
            stats: the loader's {feature: {"mean", "std", ...}}; reads ``observation.state`` and ``action``.
            tasks: the training task strings.
            cfg: the architecture (its ``vocab`` is replaced); default ``FlowVLAConfig()``.
            state_names, action_names: optional joint names recorded in the processor (LeRobot's feature names).
        """
        cfg = dataclasses.replace(cfg or FlowVLAConfig(), vocab=build_vocab(tasks))
        if cfg.relative_actions and state_names and action_names and list(state_names) != list(action_names):
            raise ValueError(f"relative_actions needs the state and the action to be the same joints in the same "
                             f"order; the state is {list(state_names)}, the action {list(action_names)}")
        longest = max((len(split_words(t)) for t in tasks), default=0)
        if longest > cfg.max_words:
            raise ValueError(f"a training task has {longest} words, more than max_words={cfg.max_words}")
        policy = cls(cfg, default_processor(cfg, state_names, action_names))
        policy.median_dims()  # a misnamed action fails before training, not at the first evaluation
        policy.set_stats(stats)
        return policy

    @property
    def horizon(self) -> int:
        return self.cfg.horizon

    @property
    def executed_steps(self) -> int:
        return self.cfg.executed_steps

    @property
    def temporal_ensemble(self) -> float | None:
        return self.cfg.temporal_ensemble

    def temporal_ensemble_for(self, task: str | None) -> float | None:
        """``cfg.temporal_ensemble_by_task``'s value for this instruction (matched by ``task_key``; None there: the
        queue), else ``cfg.temporal_ensemble``."""
        return _for_task(self.cfg.temporal_ensemble_by_task, task, self.cfg.temporal_ensemble)

    def executed_steps_for(self, task: str | None) -> int:
        """``cfg.executed_steps_by_task``'s value for this instruction (matched by ``task_key``), else
        ``cfg.executed_steps``."""
        return int(_for_task(self.cfg.executed_steps_by_task, task, self.cfg.executed_steps))

    # ------------------------------------------------------------------------------------------ statistics
    @torch.no_grad()
    def set_stats(self, stats: Stats) -> None:
        """Set the state normaliser and the action normalisation from dataset statistics (degrees); with
        ``cfg.relative_actions`` also ``stats[RELATIVE_STATS_KEY]`` {"mean", "std"} [H, A] (``relative_chunk_stats``).

        Raises:
            KeyError: ``observation.state`` or ``action`` (or their "mean"/"std") is missing.
            ValueError: a statistic has the wrong size or is not finite (named).
        """
        state_mean, state_std = _mean_std(stats, keys.OBS_STATE, self.cfg.state_dim)
        action_mean, action_std = _mean_std(stats, keys.ACTION_COL, self.cfg.action_dim)
        norm = self._state_normalizer()
        norm.mean.copy_(state_mean)
        norm.var.copy_(state_std.clamp_min(self.cfg.state_std_min).pow(2))  # (a constant joint: see the config)
        count = stats[keys.OBS_STATE].get("count")
        norm.count.fill_(float(torch.as_tensor(count).reshape(-1)[0]) if count is not None else 1.0)
        self.action_mean.copy_(action_mean)
        self.action_std.copy_(action_std.clamp_min(self.cfg.action_std_min))
        if self.cfg.relative_actions:
            if RELATIVE_STATS_KEY not in stats:
                raise KeyError(f"relative_actions needs the statistics {RELATIVE_STATS_KEY!r} of the chunk minus the "
                               f"state (policies.flow_vla.policy.relative_chunk_stats); they have {sorted(stats)}")
            shape = (self.cfg.horizon, self.cfg.action_dim)
            delta_mean, delta_std = _mean_std(stats, RELATIVE_STATS_KEY, shape[0] * shape[1])
            self.delta_mean.copy_(delta_mean.view(shape))
            self.delta_std.copy_(delta_std.view(shape).clamp_min(self.cfg.action_std_min))

    def normalize_actions(self, action: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Chunks [N, H, A] of targets (degrees) -> the expert's normalised space, given the frame's joints [N, P]."""
        if self.cfg.relative_actions:
            return (action - state[:, None, :] - self.delta_mean) / self.delta_std
        return (action - self.action_mean) / self.action_std

    def denormalize_actions(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The inverse of ``normalize_actions``: targets in degrees [N, H, A]."""
        if self.cfg.relative_actions:
            return x * self.delta_std + self.delta_mean + state[:, None, :]
        return x * self.action_std + self.action_mean

    def _state_normalizer(self) -> EmpiricalNormalizer:
        return dict(zip(self.processor.normalized, self.processor.normalizers.values(), strict=True))[keys.OBS_STATE]

    # ------------------------------------------------------------------------------------------ inputs
    def _encode(self, frame: Mapping[str, Any], augment: bool = False) -> torch.Tensor:
        """Context [N, D] of a frame (checked against the processor's features)."""
        tensors = {k: v.to(self.device) for k, v in frame.items() if isinstance(v, torch.Tensor)}
        self.processor.check(tensors)
        n = tensors[keys.OBS_STATE].shape[0]
        if keys.TASK not in frame:
            raise ValueError(f"the frame has no {keys.TASK!r} (the instruction, list[str] of {n}); it has "
                             f"{sorted(frame)}")
        tasks = frame[keys.TASK]
        tasks = [tasks] * n if isinstance(tasks, str) else list(tasks)
        if len(tasks) != n:
            raise ValueError(f"{keys.TASK!r} holds {len(tasks)} instructions for {n} frames")
        state = self.processor(tensors)[keys.OBS_STATE].float()
        if augment and self.cfg.state_noise > 0:
            state = state + self.cfg.state_noise * torch.randn_like(state)
        images = {}
        for cam in self.cfg.cameras:
            img = to_unit_range(tensors[keys.lerobot_image_key(cam)])
            images[cam] = color_jitter(random_shift(img, self.cfg.random_shift), self.cfg.color_jitter) if augment \
                else img
        tokens = tokenize(tasks, self._word_ids, self.cfg.max_words).to(self.device)
        return self.model.encode(images, tokens, state)

    def _condition_ids(self, indicator: Any, n: int) -> torch.Tensor:
        """COND_POSITIVE / COND_NEGATIVE ids [n] from an indicator (bool or float > 0.5 is positive)."""
        ind = torch.as_tensor(indicator, device=self.device).reshape(-1)
        if ind.numel() != n:
            raise ValueError(f"{CONDITION_KEY!r} holds {ind.numel()} values for {n} samples")
        pos = ind.bool() if ind.dtype == torch.bool else ind.float() > 0.5
        return torch.where(pos, COND_POSITIVE, COND_NEGATIVE)

    # ------------------------------------------------------------------------------------------ training
    def loss(self, batch: Mapping[str, Any], noise: torch.Tensor | None = None,
             time: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Flow-matching loss on a loader batch: the masked MSE between v_θ(x_t, t) and ε − a over non-padded steps
        (a normalised by the action statistics). In training mode images are randomly shifted (``cfg.random_shift``)
        and indicators dropped (``cfg.cond_dropout``); in eval mode neither, so a validation loss is comparable.

        Args:
            batch: ``observation.state`` [B, P] degrees, ``observation.images.<camera>`` [B, 3, H, W],
                ``task`` list[str] of B, ``action`` [B, H, A] degrees, ``action_is_pad`` bool [B, H] (optional),
                and ``CONDITION_KEY`` [B] (bool / float) when the config has conditioning.
            noise: ε [B·K, H, A] (default N(0, I)); time: t [B·K] (default ``sample_time``), for reproducible
                tests; K = ``cfg.flow_samples`` draws per observation, sample i's k-th at row i·K + k.

        Returns:
            (scalar loss, {"loss", "pad_fraction", "cond_dropped"}).
        """
        cfg = self.cfg
        action = batch[keys.ACTION_COL].to(self.device).float()
        b = action.shape[0]
        if tuple(action.shape[1:]) != (cfg.horizon, cfg.action_dim):
            raise ValueError(f"batch {keys.ACTION_COL!r} has shape {list(action.shape)}, the policy predicts "
                             f"[B, {cfg.horizon}, {cfg.action_dim}] chunks")
        is_pad = batch.get(keys.ACTION_IS_PAD)
        is_pad = None if is_pad is None else is_pad.to(self.device).bool().reshape(b, cfg.horizon)
        k = cfg.flow_samples
        a = self.normalize_actions(action, self._raw_state(batch, b)).repeat_interleave(k, dim=0)  # [B·K, H, A]
        is_pad = None if is_pad is None else is_pad.repeat_interleave(k, dim=0)
        eps = torch.randn_like(a) if noise is None else noise.to(a)
        t = sample_time(b * k, cfg.time_alpha, cfg.time_scale, cfg.time_offset, device=self.device) if time is None \
            else time.to(a)
        cond, dropped = None, 0.0
        if cfg.conditioning:
            if CONDITION_KEY not in batch:
                raise KeyError(f"the config has conditioning but the batch has no {CONDITION_KEY!r} "
                               f"(it has {sorted(batch)})")
            cond = self._condition_ids(batch[CONDITION_KEY], b).repeat_interleave(k)
            if self.training and cfg.cond_dropout > 0:
                drop = torch.rand(b * k, device=self.device) < cfg.cond_dropout
                cond = torch.where(drop, COND_NONE, cond)
                dropped = float(drop.float().mean())
        context = self._encode(batch, augment=self.training).repeat_interleave(k, dim=0)
        v = self.model.velocity(context, interpolate(a, eps, t), t, cond)
        loss = flow_matching_loss(v, target_velocity(a, eps), is_pad)
        pad = 0.0 if is_pad is None else float(is_pad.float().mean())
        return loss, {"loss": float(loss.detach()), "pad_fraction": pad, "cond_dropped": dropped}

    # ------------------------------------------------------------------------------------------ sampling
    @torch.no_grad()
    def act(self, obs: Mapping[str, Any], deterministic: bool = True,
            noise: torch.Tensor | None = None) -> torch.Tensor:
        """Action chunks [N, H, A]: joint position targets in degrees.

        Args:
            obs: a frame (see the module docstring); ``CONDITION_KEY`` [N] optional (default: positive).
            deterministic: start every env's ``cfg.mean_of_samples`` chunks from the fixed ε*_1..K (``fixed_noise``),
                else from fresh ε ~ N(0, I); ignored when ``noise`` is given.
            noise: ε [N, H, A] in normalised action units: one chunk per env from it, no mean.
        """
        cfg = self.cfg
        context = self._encode(obs)
        n = context.shape[0]
        shape = (n, cfg.horizon, cfg.action_dim)
        indicator = obs.get(CONDITION_KEY)
        k = 1 if noise is not None else cfg.mean_of_samples
        if noise is not None:
            if tuple(noise.shape) != shape:
                raise ValueError(f"noise has shape {list(noise.shape)}, expected {list(shape)}")
            x1 = noise.to(context)
        elif deterministic:
            x1 = self.fixed_noise(n).flatten(0, 1)  # [n·K, H, A], env-major
        else:
            x1 = torch.randn(n * k, *shape[1:], device=self.device)
        x0 = reduce_samples(self._integrate(context, x1, indicator, k).unflatten(0, (n, k)), cfg.sample_reduction,
                            self.median_dims())
        return self.denormalize_actions(x0, self._raw_state(obs, n))

    def median_dims(self) -> list[int]:
        """The action dimensions of ``cfg.median_actions``, by the processor's action names.

        Raises:
            ValueError: a name the policy's actions do not have (or actions without names).
        """
        wanted = self.cfg.median_actions
        if not wanted:
            return []
        names = list(self.processor.features.action_names)
        missing = [w for w in wanted if w not in names]
        if missing:
            have = f"its action names are {names}" if names else "its actions have no names (a dataset without them)"
            raise ValueError(f"median_actions names {missing}, which this policy's actions lack: {have}")
        return [names.index(w) for w in wanted]

    def _raw_state(self, frame: Mapping[str, Any], n: int) -> torch.Tensor:
        """The frame's joints in degrees [n, P] (the anchor of relative chunks)."""
        state = frame[keys.OBS_STATE].to(self.device).float()
        if tuple(state.shape) != (n, self.cfg.state_dim):
            raise ValueError(f"{keys.OBS_STATE!r} has shape {list(state.shape)}, expected [{n}, {self.cfg.state_dim}]")
        return state

    def fixed_noise(self, n: int) -> torch.Tensor:
        """ε*_1..K [n, K, H, A] (K = ``cfg.mean_of_samples``): K successive N(0, I) [H, A] draws from one CPU
        generator seeded with ``cfg.noise_seed`` (the first is the ε* of K = 1), the same for all n envs."""
        g = torch.Generator().manual_seed(self.cfg.noise_seed)
        eps = torch.stack([torch.randn(self.cfg.horizon, self.cfg.action_dim, generator=g)
                           for _ in range(self.cfg.mean_of_samples)])
        return eps.to(self.device).expand(n, -1, -1, -1)

    def _integrate(self, context: torch.Tensor, x1: torch.Tensor, indicator: Any, samples: int = 1) -> torch.Tensor:
        """x_0 [N·samples, H, A] from x_1 by Euler steps of v: plain, conditional (β = 1), or guided, v_u and v_c in
        one batched pass; each of the N contexts (and indicators) serves its ``samples`` rows of x_1, side by side.
        The blocks' FiLM parameters of every step are computed at once (they do not depend on x)."""
        cfg, n = self.cfg, context.shape[0]
        guided = cfg.conditioning and cfg.guidance_beta != 1.0
        cond = None
        if cfg.conditioning:
            cond = (torch.full((n,), COND_POSITIVE, device=self.device) if indicator is None
                    else self._condition_ids(indicator, n)).repeat_interleave(samples)
        context = context.repeat_interleave(samples, dim=0)  # the encoders ran once per frame
        if guided:
            context, cond = torch.cat([context, context]), torch.cat([torch.full_like(cond, COND_NONE), cond])
        m, k_steps = context.shape[0], cfg.num_steps
        times = euler_times(k_steps, self.device).repeat_interleave(m)
        films = self.model.modulation(context.repeat(k_steps, 1), times,
                                      None if cond is None else cond.repeat(k_steps)).unflatten(1, (k_steps, m))

        def velocity(x: torch.Tensor, t: torch.Tensor, k: int) -> torch.Tensor:
            if not guided:
                return self.model.expert(context, x, films[:, k])
            v_u, v_c = self.model.expert(context, torch.cat([x, x]), films[:, k]).chunk(2)
            return guided_velocity(v_u, v_c, cfg.guidance_beta)

        return euler_integrate(velocity, x1, k_steps)


def _mean_std(stats: Stats, feature: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if feature not in stats:
        raise KeyError(f"dataset statistics have no {feature!r} (they have {sorted(stats)})")
    out = []
    for name in ("mean", "std"):
        if name not in stats[feature]:
            raise KeyError(f"dataset statistics of {feature!r} have no {name!r} (they have {sorted(stats[feature])})")
        value = torch.as_tensor(stats[feature][name], dtype=torch.float32).reshape(-1)
        if value.numel() != dim or not bool(torch.isfinite(value).all()):
            raise ValueError(f"dataset statistic {feature}.{name} must be {dim} finite numbers, got {value.tolist()}")
        out.append(value)
    if bool((out[1] < 0).any()):
        raise ValueError(f"dataset statistic {feature}.std is negative: {out[1].tolist()}")
    return out[0], out[1]


def _for_task(by_task: Mapping[str, Any], task: str | None, default: Any) -> Any:
    """``by_task``'s value for this instruction, the keys matched as ``task_key`` normalises them (a value of None
    counts as set); ``default`` when none matches or the instruction is unknown."""
    if task is not None and by_task:
        want = task_key(task)
        for t, value in by_task.items():
            if task_key(t) == want:
                return value
    return default


def relative_chunk_stats(state: torch.Tensor, action: torch.Tensor, episode_end: torch.Tensor,
                         horizon: int) -> dict[str, torch.Tensor]:
    """Mean and std [H, A] over every frame i of a dataset of a_{min(i + h, end_i)} - q_i, h = 0..H-1: the
    statistics ``relative_actions`` normalises by (chunks padded past an episode's end by its last action, as the
    loader pads them).

    Args:
        state: joints q [N, P] degrees, frames in dataset order; action: targets [N, A] degrees (A == P);
        episode_end: the index of each frame's episode's last frame [N]; horizon: H.
    """
    if state.shape != action.shape:
        raise ValueError(f"state {list(state.shape)} and action {list(action.shape)} must have the same shape")
    idx = torch.minimum(torch.arange(len(state))[:, None] + torch.arange(horizon), episode_end.long()[:, None])
    delta = action.double()[idx] - state.double()[:, None, :]  # [N, H, A]
    return {"mean": delta.mean(0).float(), "std": delta.std(0, correction=0).float()}
