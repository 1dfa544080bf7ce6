"""``MujocoFamilyEnv``: the VecEnv contract over a ``Physics`` backend (mujoco CPU, mjx, warp) and a ``Task``.

A backend (``sim.physics.Physics``) holds N copies of one model's state as batched torch tensors and advances
them; a task (``sim/tasks/``) turns that state into observations, reward terms, terminations and resets; this
env owns the contract of ``robot_rl.env.VecEnv``: action checks, auto-reset (optional) with the true final
observation, episode statistics, and per-env fault handling (a non-finite or diverged simulation terminates and
resets only the affected envs, and nothing non-finite reaches the policy).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from policies import keys
from robot_rl.env import EpisodeTracker, Obs, VecEnv, actor_ids, sanitize_action
from sim.config import SimConfig
from sim.physics import Physics
from sim.step_bookkeeping import end_of_step_cpu, end_of_step_torch
from sim.task import Task, reward_weight_vector

log = logging.getLogger(__name__)

ACTOR_GROUPS = (keys.POLICY, keys.PROPRIO)  # what a policy sees: observation noise goes here, never to the critic


class MujocoFamilyEnv(VecEnv):
    """The VecEnv over a ``Physics`` backend and a ``Task``. Resumable: ``state_dict`` holds everything."""

    resumable = True

    def __init__(self, task: Task, physics: Physics, cfg: SimConfig) -> None:
        self.task, self.physics, self.cfg = task, physics, cfg
        self.num_envs = cfg.num_envs
        self.device = torch.device(cfg.device)
        self.action_dim = task.action_dim
        self.max_episode_length = int(task.cfg.episode_length)
        self.control_dt = float(physics.model.opt.timestep) * task.decimation
        self.autoreset = bool(cfg.autoreset)
        self.render_size = (int(getattr(task.cfg, "image_width", 128)), int(getattr(task.cfg, "image_height", 128)))
        self._reward_w = reward_weight_vector(task, self.device)  # before bind: a typo fails before any work
        self._reward_log_names = [f"reward/{k}" for k in task.reward_term_names]
        task.bind(physics.model, self.num_envs, self.device)
        self.obs_spec = task.obs_spec()
        for cam in task.cameras():
            w, h = self.render_size
            self.obs_spec.shapes[keys.image_key(cam)] = (3, h, w)
            self.obs_spec.dtypes[keys.image_key(cam)] = torch.uint8
        n, dev = self.num_envs, self.device
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(cfg.seed)
        self.episodes = EpisodeTracker(n, dev)
        self.counters = {"sim_nan_resets": 0, "sim_diverged_resets": 0, "nonfinite_action_resets": 0}
        self._all = torch.arange(n, device=dev)
        self._needs_reset = True
        self._ended = torch.zeros(n, dtype=torch.bool, device=dev)  # ended, waiting for reset (autoreset off)
        self._instructions: list[str] | None = None  # built on first read after a reset
        self.dr = cfg.randomization
        nu = physics.model.nu
        # Action latency: ctrl history [L + 1, N, nu], newest first; env i applies the row latency[i].
        self.latency = torch.zeros(n, dtype=torch.long, device=dev)
        self._ctrl_hist = torch.zeros(self.dr.max_latency + 1, n, nu, dtype=physics.state.ctrl.dtype, device=dev)
        # On the CPU the end of the step (faults, terminations, episode sums) is one compiled pass; its torch
        # reference runs on a GPU (sim/step_bookkeeping.py).
        self.fused_bookkeeping = self.device.type == "cpu"
        self._terminate_on_success = bool(getattr(task.cfg, "terminate_on_success", True))

    @property
    def instructions(self) -> list[str]:
        """[N] the instruction of each env's current episode."""
        if self._instructions is None:
            self._instructions = self.task.instructions(self.num_envs)
        return self._instructions

    # ----------------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Obs, dict[str, Any]]:
        if seed is not None:
            self.gen.manual_seed(int(seed))
        if env_ids is None:
            ids = self._all
        else:
            ids = torch.as_tensor(env_ids, device=self.device).long().flatten()
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_envs):
                raise ValueError(f"env_ids must lie in [0, {self.num_envs}), got {ids.tolist()}")
            if self._needs_reset and ids.unique().numel() != self.num_envs:
                raise RuntimeError("the first reset() must reset every env (env_ids=None)")
        self._reset_envs(ids)
        self._ended[ids] = False
        self._needs_reset = False
        return self._observe(), {keys.LOG: {}}

    def _reset_envs(self, env_ids: torch.Tensor) -> None:
        if env_ids.numel() == 0:
            return
        if self.dr.physics_enabled:
            self.physics.randomize(env_ids, self.gen)
        self.task.reset(self.physics.state, env_ids, self.gen)
        self.physics.forward(env_ids)
        if self.dr.max_latency > 0:
            lo, hi = self.dr.action_latency
            self.latency[env_ids] = torch.randint(int(lo), int(hi) + 1, (len(env_ids),), generator=self.gen).to(
                self.device)
            self._ctrl_hist[:, env_ids] = self.physics.state.ctrl[env_ids]
        self.episodes.reset(env_ids)
        self._instructions = None

    # ------------------------------------------------------------------------------------------------ step
    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        if not self.autoreset and bool(self._ended.any()):
            ids = self._ended.nonzero().flatten().tolist()
            raise RuntimeError(f"envs {ids} ended and sim.autoreset is off: call reset(env_ids=...) on them before "
                               "the next step")
        action, bad = sanitize_action(action, self.num_envs, self.action_dim, self.device,
                                      self.cfg.on_nonfinite_action)
        who = actor_ids(actor, self.num_envs, self.device)
        state = self.physics.state
        ctrl = self.task.action_to_ctrl(state, action)
        if bad is not None:  # NaN never reaches MuJoCo: bad rows hold the previous control and are terminated below
            ctrl = torch.where(bad[:, None], state.ctrl, ctrl)
            self.counters["nonfinite_action_resets"] += int(bad.sum())
        if self.dr.max_latency > 0:  # the command sent now reaches the servos latency[i] steps later
            self._ctrl_hist = torch.roll(self._ctrl_hist, 1, dims=0)
            self._ctrl_hist[0] = ctrl
            ctrl = self._ctrl_hist[self.latency, self._all]
        diverged = self.physics.step(ctrl, self.task.decimation)
        nan_state, too_fast = self.physics.faults(self.cfg.max_abs_qvel)
        weighted = self.task.reward_term_matrix(state, action).float() * self._reward_w  # [N, terms]
        reward = weighted.sum(dim=1)
        log_scalars = dict(zip(self._reward_log_names, weighted.mean(dim=0).tolist()))
        success = self.task.success(state)
        terminated = self.task.terminated(state)
        end_of_step = end_of_step_cpu if self.fused_bookkeeping else end_of_step_torch
        end = end_of_step(reward, success, terminated, nan_state, too_fast, diverged, bad, self._terminate_on_success,
                          self.episodes, self.max_episode_length)  # reward sanitised in place, episodes advanced
        self.counters["sim_nan_resets"] += end.n_nan
        self.counters["sim_diverged_resets"] += end.n_diverged
        success, terminated, truncated, faulted, done = end.success, end.terminated, end.truncated, end.faulted, end.done

        obs = self._observe()
        info: dict[str, Any] = {keys.SUCCESS: success, keys.FAULTED: faulted, keys.APPLIED_ACTION: action,
                                keys.ACTOR: who}
        if end.n_done:
            final_obs = {k: v.clone() for k, v in obs.items()}
            if end.n_faulted:
                for v in final_obs.values():
                    if v.is_floating_point():
                        v[faulted] = 0.0
            info[keys.EPISODE] = self.episodes.stats()
            if self.autoreset:
                ids = done.nonzero().flatten()
                self._reset_envs(ids)
                new_obs = self._observe(ids)
                for k in obs:
                    obs[k][ids] = new_obs[k]
            else:
                self._ended |= done
                obs = final_obs
            info[keys.FINAL_OBS] = final_obs
        else:
            info[keys.FINAL_OBS] = obs
        log_scalars.update({f"sim/{k}": float(v) for k, v in self.counters.items()})
        info[keys.LOG] = log_scalars
        return obs, reward, terminated, truncated, info

    # ---------------------------------------------------------------------------------------- observations
    def _observe(self, env_ids: torch.Tensor | None = None) -> Obs:
        obs = self.task.observations(self.physics.state)
        if env_ids is not None:
            obs = {k: v[env_ids] for k, v in obs.items()}
        obs = {k: torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) for k, v in obs.items()}
        if self.dr.obs_noise > 0:
            for g in ACTOR_GROUPS:
                if g in obs:
                    x = obs[g]
                    obs[g] = x + self.dr.obs_noise * torch.randn(x.shape, generator=self.gen).to(x.device)
        w, h = self.render_size
        cams = list(self.task.cameras())
        if cams:
            for cam, img in self.physics.render_many(cams, w, h, env_ids).items():
                obs[keys.image_key(cam)] = img.to(self.device)
        return obs

    def render(self, camera: str | None = None, width: int = 256, height: int = 256,
               env_ids: torch.Tensor | None = None) -> torch.Tensor:
        cams = self.task.cameras() or ["front"]
        return self.physics.render(camera or cams[0], width, height, env_ids)

    def render_many(self, cameras: list[str], width: int, height: int,
                    env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """{camera: uint8 [len(env_ids), 3, H, W]}: several cameras in one go (tiles of one GL pass)."""
        return self.physics.render_many(list(cameras), width, height, env_ids)

    # --------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {
            "physics": self.physics.state_dict(),
            "task": {k: v.clone() for k, v in self.task.task_state_dict().items()},
            "episodes": self.episodes.state_dict(),
            "ended": self._ended.clone(),
            "gen": self.gen.get_state(),
            "counters": dict(self.counters),
            "latency": self.latency.clone(),
            "ctrl_hist": self._ctrl_hist.clone(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.physics.load_state_dict(sd["physics"])
        self.task.load_task_state_dict(sd["task"])
        self.episodes.load_state_dict(sd["episodes"])
        self._ended.copy_(sd["ended"])
        self.gen.set_state(sd["gen"])
        self.counters = {k: int(v) for k, v in sd["counters"].items()}
        self.latency.copy_(sd["latency"])
        self._ctrl_hist.copy_(sd["ctrl_hist"])
        self._needs_reset = False
        self._instructions = None

    def close(self) -> None:
        self.physics.close()
