"""The MuJoCo-family batched environment: what every backend (mujoco CPU, mjx, warp) shares.

A backend (``Physics``) holds N copies of one model's state as batched torch tensors and advances them;
a task (``sim/tasks/``) turns that state into observations, reward terms, terminations and resets;
``MujocoFamilyEnv`` owns the contract of ``robot_rl.env.VecEnv``: action checks, auto-reset with the true
final observation, episode statistics, and per-env fault handling (a non-finite or diverged simulation
terminates and resets only the affected envs, and nothing non-finite reaches the policy).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np
import torch

from robot_rl import keys
from robot_rl.env import Obs, ObsSpec, VecEnv, check_action, nonfinite_rows
from sim.randomization import BatchedModelParams, RandomizationConfig

log = logging.getLogger(__name__)


@dataclass
class SimConfig:
    """The simulator: which backend, how many envs, how they run."""

    backend: str = "mujoco"  # one of sim.registry.BACKENDS
    num_envs: int = 64  # N, envs stepped together
    num_threads: int = 2  # CPU threads stepping physics (mujoco backend)
    device: str = "cpu"  # torch device of the tensors crossing the VecEnv boundary
    seed: int = 0  # seeds task randomization; the same seed gives the same trajectories
    on_nonfinite_action: str = "raise"  # "raise" (a clear error) or "reset" (terminate and reset those envs)
    max_abs_qvel: float = 1e3  # rad/s or m/s; beyond this a simulation counts as diverged and is reset
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)  # domain randomization

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"sim.num_envs must be >= 1, got {self.num_envs}")
        if self.num_threads < 1:
            raise ValueError(f"sim.num_threads must be >= 1, got {self.num_threads}")
        if self.on_nonfinite_action not in ("raise", "reset"):
            raise ValueError(f"sim.on_nonfinite_action must be 'raise' or 'reset', got {self.on_nonfinite_action!r}")


class SimState:
    """Batched view of N simulations for tasks: torch tensors [N, ...] plus name lookups.

    ``sensordata`` rows are computed inside the last physics substep (before its integration), the same
    convention as gymnasium's MuJoCo envs and MJX; ``qpos``/``qvel`` are the state after it.
    """

    def __init__(self, model: mujoco.MjModel, qpos: torch.Tensor, qvel: torch.Tensor, ctrl: torch.Tensor,
                 mocap_pos: torch.Tensor, mocap_quat: torch.Tensor, sensordata: torch.Tensor) -> None:
        self.model = model
        self.qpos, self.qvel, self.ctrl = qpos, qvel, ctrl
        self.mocap_pos, self.mocap_quat = mocap_pos, mocap_quat  # [N, nmocap, 3], [N, nmocap, 4]
        self.sensordata = sensordata
        self._sensor_slices = {}
        for i in range(model.nsensor):
            adr, dim = int(model.sensor_adr[i]), int(model.sensor_dim[i])
            self._sensor_slices[model.sensor(i).name] = slice(adr, adr + dim)

    @property
    def num_envs(self) -> int:
        return self.qpos.shape[0]

    def sensor(self, name: str) -> torch.Tensor:
        """[N, dim] readings of a named sensor."""
        try:
            return self.sensordata[:, self._sensor_slices[name]]
        except KeyError:
            raise KeyError(f"no sensor named {name!r}; the model has {sorted(self._sensor_slices)}") from None


class Physics(ABC):
    """N simulations of one model. Tensors in ``state`` are updated in place by ``step`` and ``set``."""

    model: mujoco.MjModel
    state: SimState
    num_envs: int

    @abstractmethod
    def step(self, ctrl: torch.Tensor, nsubsteps: int) -> torch.Tensor:
        """Hold ``ctrl`` [N, nu] for ``nsubsteps`` physics steps. Returns bool [N]: envs that diverged."""

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        """Draw new per-env model parameters for ``env_ids`` (see ``sim.randomization``)."""
        raise NotImplementedError(f"{type(self).__name__} does not randomize model parameters")

    def nonfinite(self) -> torch.Tensor:
        """bool [N]: envs whose state or sensor readings hold a NaN or inf."""
        s = self.state
        return nonfinite_rows(s.qpos) | nonfinite_rows(s.qvel) | nonfinite_rows(s.sensordata)

    @abstractmethod
    def forward(self, env_ids: torch.Tensor) -> None:
        """Recompute derived quantities (sensordata) of ``env_ids`` after their state was written."""

    @abstractmethod
    def render(self, camera: str, width: int, height: int, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [len(env_ids), 3, H, W] frames."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        s = self.state
        return {k: getattr(s, k).clone() for k in ("qpos", "qvel", "ctrl", "mocap_pos", "mocap_quat", "sensordata")}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k, v in sd.items():
            getattr(self.state, k).copy_(v)

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class BatchedParamsPhysics(Physics):
    """A device backend (mjx, warp) whose randomized model fields live as [N, ...] tensors in one
    ``BatchedModelParams`` (None: nothing randomized); they are redrawn, saved and restored here."""

    _params: BatchedModelParams | None = None

    def _params_changed(self) -> None:  # noqa: B027 - optional hook
        """Called after the parameter tensors were rewritten (redrawn or loaded)."""

    def randomize(self, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        if self._params is not None:
            self._params.randomize(env_ids, gen)
            self._params_changed()

    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = super().state_dict()
        if self._params is not None:
            sd.update(self._params.state_dict())
        return sd

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        super().load_state_dict({k: v for k, v in sd.items() if not k.startswith("model.")})
        if self._params is not None:
            self._params.load_state_dict(sd)
            self._params_changed()


class Task(ABC):
    """A task on a MuJoCo model: observations, reward terms, terminations, resets. One file per task.

    Reward terms are small batched functions returning [N] tensors; their weights live in the task config
    (``cfg.reward_weights``) and each weighted term is logged as ``reward/<term>``.
    """

    name: str
    instruction: str
    cfg: Any
    action_dim: int
    decimation: int  # physics steps per control step

    @abstractmethod
    def build_spec(self) -> mujoco.MjSpec:
        """The scene, with the sensors the task reads."""

    @abstractmethod
    def bind(self, model: mujoco.MjModel, num_envs: int, device: torch.device) -> None:
        """Resolve names to indices and allocate per-env buffers."""

    @abstractmethod
    def obs_spec(self) -> ObsSpec: ...

    @abstractmethod
    def reset(self, state: SimState, env_ids: torch.Tensor, gen: torch.Generator) -> None:
        """Write new initial qpos/qvel/ctrl/mocap for ``env_ids`` into ``state``; resample commands/targets."""

    @abstractmethod
    def action_to_ctrl(self, state: SimState, action: torch.Tensor) -> torch.Tensor:
        """[N, A] in [-1, 1] -> actuator controls [N, nu] in the model's units."""

    @abstractmethod
    def observations(self, state: SimState) -> Obs:
        """State observation groups (images are added by the env when the task asks for cameras)."""

    @abstractmethod
    def reward_terms(self, state: SimState, action: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted reward terms, each [N]."""

    @abstractmethod
    def success(self, state: SimState) -> torch.Tensor:
        """bool [N]."""

    def terminated(self, state: SimState) -> torch.Tensor:
        """bool [N]: true ends other than success (a fall, an object off the table)."""
        return torch.zeros(state.num_envs, dtype=torch.bool, device=state.qpos.device)

    def cameras(self) -> list[str]:
        """Cameras whose images are observations (empty: state-only)."""
        return []

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        """Per-env task buffers (targets, commands, previous actions) for checkpoints."""
        return {}

    def load_task_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        for k, v in sd.items():
            getattr(self, k).copy_(v)


class MujocoFamilyEnv(VecEnv):
    """The VecEnv over a ``Physics`` backend and a ``Task``."""

    def __init__(self, task: Task, physics: Physics, cfg: SimConfig) -> None:
        self.task, self.physics, self.cfg = task, physics, cfg
        self.num_envs = cfg.num_envs
        self.device = torch.device(cfg.device)
        self.action_dim = task.action_dim
        self.max_episode_length = int(task.cfg.episode_length)
        self.control_dt = float(physics.model.opt.timestep) * task.decimation
        self.instruction = task.instruction
        self.render_size = (int(getattr(task.cfg, "image_width", 128)), int(getattr(task.cfg, "image_height", 128)))
        task.bind(physics.model, self.num_envs, self.device)
        self.obs_spec = task.obs_spec()
        for cam in task.cameras():
            w, h = self.render_size
            self.obs_spec.shapes[keys.image_key(cam)] = (3, h, w)
            self.obs_spec.dtypes[keys.image_key(cam)] = torch.uint8
        n, dev = self.num_envs, self.device
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(cfg.seed)
        self.episode_step = torch.zeros(n, dtype=torch.long, device=dev)
        self.episode_return = torch.zeros(n, dtype=torch.float32, device=dev)
        self.episode_success = torch.zeros(n, dtype=torch.bool, device=dev)
        self.counters = {"sim_nan_resets": 0, "sim_diverged_resets": 0, "nonfinite_action_resets": 0}
        self._all = torch.arange(n, device=dev)
        self._needs_reset = True
        self.dr = cfg.randomization
        nu = physics.model.nu
        # Action latency: ctrl history [L + 1, N, nu], newest first; env i applies the row latency[i].
        self.latency = torch.zeros(n, dtype=torch.long, device=dev)
        self._ctrl_hist = torch.zeros(self.dr.max_latency + 1, n, nu, dtype=physics.state.ctrl.dtype, device=dev)

    # ----------------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        if seed is not None:
            self.gen.manual_seed(int(seed))
        self._reset_envs(self._all)
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
        self.episode_step[env_ids] = 0
        self.episode_return[env_ids] = 0.0
        self.episode_success[env_ids] = False

    # ------------------------------------------------------------------------------------------------ step
    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        action = check_action(action, self.num_envs, self.action_dim).to(self.device)
        bad_action = nonfinite_rows(action)
        if bad_action.any():
            ids = bad_action.nonzero().flatten().tolist()
            if self.cfg.on_nonfinite_action == "raise":
                raise ValueError(
                    f"non-finite action (NaN/inf) for envs {ids[:10]}{'...' if len(ids) > 10 else ''}; "
                    "nothing was sent to the simulator. Set sim.on_nonfinite_action=reset to reset those envs instead."
                )
            self.counters["nonfinite_action_resets"] += len(ids)
        # NaN never reaches MuJoCo: bad rows hold the previous control and are terminated below.
        action = torch.where(bad_action[:, None], torch.zeros_like(action), action).clamp(-1.0, 1.0)
        state = self.physics.state
        ctrl = self.task.action_to_ctrl(state, action)
        ctrl = torch.where(bad_action[:, None], state.ctrl, ctrl)
        if self.dr.max_latency > 0:  # the command sent now reaches the servos latency[i] steps later
            self._ctrl_hist = torch.roll(self._ctrl_hist, 1, dims=0)
            self._ctrl_hist[0] = ctrl
            ctrl = self._ctrl_hist[self.latency, self._all]
        diverged = self.physics.step(ctrl, self.task.decimation)
        nan_state = self.physics.nonfinite()
        diverged = diverged | (state.qvel.abs().amax(dim=1) > self.cfg.max_abs_qvel)
        faulted = nan_state | diverged | bad_action
        self.counters["sim_nan_resets"] += int(nan_state.sum())
        self.counters["sim_diverged_resets"] += int((diverged & ~nan_state).sum())
        self.episode_step += 1

        terms = self.task.reward_terms(state, action)
        weights = self.task.cfg.reward_weights
        w = torch.tensor([float(weights.get(k, 0.0)) for k in terms], device=self.device)
        weighted = torch.stack(list(terms.values()), dim=1).float() * w  # [N, terms]
        reward = weighted.sum(dim=1)
        log_scalars = {f"reward/{k}": v for k, v in zip(terms, weighted.mean(dim=0).tolist())}
        success = self.task.success(state)
        terminated = self.task.terminated(state) | faulted
        if getattr(self.task.cfg, "terminate_on_success", True):
            terminated = terminated | success
        truncated = (self.episode_step >= self.max_episode_length) & ~terminated
        # A faulted env's reward and observation are meaningless: zero them so nothing non-finite escapes.
        reward = torch.where(faulted | ~torch.isfinite(reward), torch.zeros_like(reward), reward)
        success = success & ~faulted
        self.episode_return += reward
        self.episode_success |= success

        obs = self._observe()
        done = terminated | truncated
        info: dict[str, Any] = {keys.SUCCESS: success, "faulted": faulted}
        if done.any():
            final_obs = {k: v.clone() for k, v in obs.items()}
            for v in final_obs.values():
                if v.is_floating_point():
                    v[faulted] = 0.0
            info[keys.EPISODE] = {
                keys.EP_RETURN: self.episode_return.clone(),
                keys.EP_LENGTH: self.episode_step.clone(),
                keys.EP_SUCCESS: self.episode_success.clone(),
            }
            ids = done.nonzero().flatten()
            self._reset_envs(ids)
            new_obs = self._observe(ids)
            for k in obs:
                obs[k][ids] = new_obs[k]
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
            p = obs[keys.POLICY]
            obs[keys.POLICY] = p + self.dr.obs_noise * torch.randn(p.shape, generator=self.gen).to(p.device)
        w, h = self.render_size
        for cam in self.task.cameras():
            obs[keys.image_key(cam)] = self.physics.render(cam, w, h, env_ids).to(self.device)
        return obs

    def render(self, camera: str | None = None, width: int = 256, height: int = 256,
               env_ids: torch.Tensor | None = None) -> torch.Tensor:
        cams = self.task.cameras() or ["front"]
        return self.physics.render(camera or cams[0], width, height, env_ids)

    # --------------------------------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {
            "physics": self.physics.state_dict(),
            "task": {k: v.clone() for k, v in self.task.task_state_dict().items()},
            "episode_step": self.episode_step.clone(),
            "episode_return": self.episode_return.clone(),
            "episode_success": self.episode_success.clone(),
            "gen": self.gen.get_state(),
            "counters": dict(self.counters),
            "latency": self.latency.clone(),
            "ctrl_hist": self._ctrl_hist.clone(),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.physics.load_state_dict(sd["physics"])
        self.task.load_task_state_dict(sd["task"])
        self.episode_step.copy_(sd["episode_step"])
        self.episode_return.copy_(sd["episode_return"])
        self.episode_success.copy_(sd["episode_success"])
        self.gen.set_state(sd["gen"])
        self.counters = {k: int(v) for k, v in sd["counters"].items()}
        self.latency.copy_(sd["latency"])
        self._ctrl_hist.copy_(sd["ctrl_hist"])
        self._needs_reset = False

    def close(self) -> None:
        self.physics.close()


def as_numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy array sharing memory with a CPU tensor."""
    return t.detach().numpy()
