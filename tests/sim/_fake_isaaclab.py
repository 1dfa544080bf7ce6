"""A STAND-IN for an Isaac Lab RL env, for testing ``sim/isaaclab.py`` quickly and without Isaac Lab installed.

Isaac Lab needs Python 3.12 and an environment of its own (it pins torch, warp, newton, transformers ...), so
this project's venv does not carry it, and a real task takes minutes to build and step on a CPU (see
tests/sim/test_isaaclab.py). This class reproduces the interface and the behaviour the adapter relies on, as
they are in Isaac Lab 3.0.0 (``isaaclab/envs/manager_based_rl_env.py``,
``direct_rl_env.py``, ``managers/termination_manager.py``, ``managers/reward_manager.py``); it is not Isaac Lab.
"""

from __future__ import annotations

import contextlib
import math
import types
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np
import torch
from gymnasium.envs.registration import EnvSpec


@dataclass
class FakeEnvCfg:
    """The fields of ``ManagerBasedRLEnvCfg`` / ``DirectRLEnvCfg`` the adapter reads."""

    is_finite_horizon: bool = False  # True: Isaac Lab's wrappers send no time-out signal
    compute_final_obs: bool = True  # True: extras["final_obs"] holds the pre-reset observation on reset steps
    episode_length_s: float = 5.0  # s; max_episode_length = ceil(episode_length_s / step_dt) = 40
    seed: int | None = None
    num_envs: int = 64  # N (Isaac Lab: scene.num_envs, set by parse_env_cfg)
    device: str = "cpu"  # (Isaac Lab: sim.device, set by parse_env_cfg)


class FakeTerminationManager:
    """Stands in for ``isaaclab.managers.TerminationManager``: named terms, ``get_term`` valid after the reset."""

    active_terms: ClassVar[list[str]] = ["time_out", "success"]

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self._term_dones = torch.zeros(num_envs, len(self.active_terms), dtype=torch.bool, device=device)

    def get_term(self, name: str) -> torch.Tensor:
        return self._term_dones[:, self.active_terms.index(name)]


class FakeIsaacLabEnv(gymnasium.Env):
    """Stands in for Isaac Lab's ``ManagerBasedRLEnv`` (not installed in this venv): a 1-D point mass to drive
    to the origin, batched in torch, with Isaac Lab's step/reset signatures and same-step auto-reset.

    x' = x + 0.1·a (the action term's scale), reward −|x|, terminated ("success" term) when |x| < 0.05,
    time-out ("time_out" term) after 40 steps. Observation groups: ``policy`` = [x]; ``critic`` = [x, t/T]
    (Isaac Lab's privileged group; absent with ``critic=False``, as in a ``DirectRLEnv`` without a state space).

    Like Isaac Lab, it rewrites ``reward_buf``, ``reset_terminated`` and ``reset_time_outs`` in place every step
    and keeps one ``extras`` dict whose ``"log"`` is refilled only when envs reset.
    """

    is_vector_env = True

    def __init__(self, num_envs: int = 64, device: str = "cpu", cfg: FakeEnvCfg | None = None, critic: bool = True,
                 action_space: gymnasium.spaces.Box | None = None) -> None:
        self.cfg = cfg or FakeEnvCfg()
        self.num_envs, self.device = num_envs, torch.device(device)
        self.step_dt = 0.125  # s per env step (sim.dt * decimation)
        policy = gymnasium.spaces.Box(-np.inf, np.inf, (1,))
        groups = {"policy": policy, **({"critic": gymnasium.spaces.Box(-np.inf, np.inf, (2,))} if critic else {})}
        self.single_observation_space = gymnasium.spaces.Dict(groups)
        self.single_action_space = action_space or gymnasium.spaces.Box(-np.inf, np.inf, (1,))  # Isaac Lab: unbounded
        self.termination_manager = FakeTerminationManager(num_envs, self.device)
        self.gen = torch.Generator().manual_seed(0)
        n, dev = num_envs, self.device
        self.x = torch.zeros(n, device=dev)
        self.episode_length_buf = torch.zeros(n, dtype=torch.long, device=dev)
        self.reward_buf = torch.zeros(n, device=dev)
        self.reset_terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        self.reset_time_outs = torch.zeros(n, dtype=torch.bool, device=dev)
        self._episode_sum = torch.zeros(n, device=dev)
        self.extras: dict[str, Any] = {}
        self.actions_received: list[torch.Tensor] = []  # what reached the "simulator"
        self.closed = False

    @property
    def max_episode_length(self) -> int:
        return math.ceil(self.cfg.episode_length_s / self.step_dt)

    def seed(self, seed: int = -1) -> int:
        self.gen.manual_seed(seed)  # Isaac Lab's configure_seed seeds torch/numpy/random/warp globally
        return seed

    def _observations(self) -> dict[str, torch.Tensor]:
        obs = {"policy": self.x[:, None].clone()}
        if "critic" in self.single_observation_space.spaces:
            obs["critic"] = torch.stack([self.x, self.episode_length_buf.float() / self.max_episode_length], 1)
        return obs

    def _reset_idx(self, env_ids: torch.Tensor) -> None:
        # reward_manager.reset: mean episodic sum over the reset envs / episode_length_s; termination rates
        success_rate = self.termination_manager.get_term("success").float().mean()
        self.extras["log"] = {"Episode_Reward/distance": self._episode_sum[env_ids].mean() / self.cfg.episode_length_s,
                              "Episode_Termination/success": success_rate}
        u = torch.rand(2, len(env_ids), generator=self.gen).to(self.device)
        self.x[env_ids] = torch.where(u[0] < 0.5, -1.0, 1.0) * (0.3 + 0.7 * u[1])
        self.episode_length_buf[env_ids] = 0
        self._episode_sum[env_ids] = 0.0

    def reset(self, env_ids: torch.Tensor | slice | None = None, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if seed is not None:
            self.seed(seed)
        ids = torch.arange(self.num_envs, device=self.device)[env_ids if env_ids is not None else slice(None)]
        self._reset_idx(ids)
        return self._observations(), self.extras

    def step(self, action: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor,
                                                   torch.Tensor, dict[str, Any]]:
        action = action.to(self.device)
        self.actions_received.append(action.clone())
        self.x = self.x + 0.1 * action[:, 0]
        self.episode_length_buf += 1
        terms = self.termination_manager._term_dones
        terms[:, 0] = self.episode_length_buf >= self.max_episode_length
        terms[:, 1] = self.x.abs() < 0.05
        self.reset_time_outs[:], self.reset_terminated[:] = terms[:, 0], terms[:, 1]
        self.reward_buf[:] = -self.x.abs()
        self._episode_sum += self.reward_buf
        reset_ids = (self.reset_terminated | self.reset_time_outs).nonzero().flatten()
        if len(reset_ids) > 0:
            if self.cfg.compute_final_obs:
                self.extras["final_obs"] = self._observations()
            self._reset_idx(reset_ids)
        return self._observations(), self.reward_buf, self.reset_terminated, self.reset_time_outs, self.extras

    def close(self) -> None:
        self.closed = True


STAND_IN_ID = "StandIn-IsaacLab-PointMass-v0"  # a gymnasium id that builds FakeIsaacLabEnv, not an Isaac Lab task


def make_stand_in_isaaclab() -> tuple[dict[str, types.ModuleType], EnvSpec, dict[str, list]]:
    """STAND-INS for what ``make_isaaclab_env`` imports from Isaac Lab (``isaaclab_tasks``,
    ``isaaclab_tasks.utils.parse_env_cfg``, ``isaaclab.app.launch_simulation``, with their 3.0.0 signatures) and for
    the gymnasium registration ``import isaaclab_tasks`` makes, under ``STAND_IN_ID``.

    With the modules in ``sys.modules`` and the spec in ``gymnasium.registry`` (``monkeypatch.setitem``),
    ``make_isaaclab_env(STAND_IN_ID, ...)`` runs its own code on a ``FakeIsaacLabEnv``. Returns the modules, the spec
    and a record of the calls: ``"parse_env_cfg"`` (task id, device, N, overrides), ``"launch"`` (launcher args),
    ``"shutdown"``, ``"make"`` (the env config of each env built).
    """
    calls: dict[str, list] = defaultdict(list)

    def parse_env_cfg(task_name: str, device: str | None = None, num_envs: int | None = None,
                      use_fabric: bool | None = None, overrides: Any = ()) -> FakeEnvCfg:
        if isinstance(overrides, str):
            raise TypeError("overrides must be a list or tuple of strings")  # as Isaac Lab's
        calls["parse_env_cfg"].append((task_name, device, num_envs, list(overrides)))
        return FakeEnvCfg(compute_final_obs=False, num_envs=num_envs or 64, device=device or "cpu")

    @contextlib.contextmanager
    def launch_simulation(cfg: Any, launcher_args: dict[str, Any] | None = None):
        calls["launch"].append(launcher_args)
        try:
            yield None
        finally:
            calls["shutdown"].append(True)

    def entry_point(cfg: FakeEnvCfg, **_: Any) -> FakeIsaacLabEnv:
        calls["make"].append(cfg)
        return FakeIsaacLabEnv(cfg.num_envs, cfg.device, cfg)

    spec = EnvSpec(STAND_IN_ID, entry_point=entry_point, disable_env_checker=True)  # as Isaac Lab registers its ids
    modules = {name: types.ModuleType(name) for name in ("isaaclab", "isaaclab.app", "isaaclab_tasks",
                                                         "isaaclab_tasks.utils")}
    modules["isaaclab.app"].launch_simulation = launch_simulation
    modules["isaaclab_tasks.utils"].parse_env_cfg = parse_env_cfg
    modules["isaaclab"].app, modules["isaaclab_tasks"].utils = modules["isaaclab.app"], modules["isaaclab_tasks.utils"]
    return modules, spec, calls
