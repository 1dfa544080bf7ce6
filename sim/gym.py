"""Interop: our tasks as single gymnasium envs and as a Stable-Baselines3 ``VecEnv`` (``sb3_vec_env``).

    import sim  # registers robot_rl/SO101Reach-v0, robot_rl/SO101Lift-v0, robot_rl/SO101Push-v0,
                # robot_rl/SO101Pick-v0, robot_rl/HumanoidWalk-v0
    env = gymnasium.make("robot_rl/SO101Lift-v0")

Observations: the ``policy`` group as a float32 ``Box``; with cameras, a ``Dict`` of it (``"state"``) and one
uint8 ``[3, H, W]`` image per camera. Actions: ``Box(-1, 1, (A,))``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from policies import keys
from robot_rl.env import VecEnv
from sim.config import SimConfig

GYM_IDS = {
    "robot_rl/SO101Reach-v0": "so101_reach",
    "robot_rl/SO101Lift-v0": "so101_lift",
    "robot_rl/SO101Push-v0": "so101_push",
    "robot_rl/SO101Pick-v0": "so101_pick",
    "robot_rl/HumanoidWalk-v0": "humanoid_walk",
}


def register_envs() -> None:
    for env_id, task in GYM_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point="sim.gym:SingleEnv", kwargs={"task": task})


def _spaces(venv: VecEnv) -> tuple[spaces.Space, spaces.Box]:
    state = spaces.Box(-np.inf, np.inf, venv.obs_spec.shapes[keys.POLICY], np.float32)
    images = {k[len(keys.IMAGE_PREFIX):]: spaces.Box(0, 255, shape, np.uint8)
              for k, shape in venv.obs_spec.shapes.items() if k.startswith(keys.IMAGE_PREFIX)}
    obs_space = spaces.Dict({"state": state, **images}) if images else state
    return obs_space, spaces.Box(-1.0, 1.0, (venv.action_dim,), np.float32)


def _to_numpy(obs: dict[str, torch.Tensor], dict_space: bool, index: int | None = None) -> Any:
    """Batched obs -> numpy (all rows, or the row ``index``), as a Box array or a dict of them."""
    rows = slice(None) if index is None else index
    state = obs[keys.POLICY][rows].cpu().numpy().astype(np.float32)
    if not dict_space:
        return state
    out = {"state": state}
    out.update({k[len(keys.IMAGE_PREFIX):]: v[rows].cpu().numpy()
                for k, v in obs.items() if k.startswith(keys.IMAGE_PREFIX)})
    return out


class SingleEnv(gymnasium.Env):
    """One of our tasks behind the gymnasium single-env API (a batched env of size 1 underneath)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, task: str = "so101_reach", render_mode: str | None = None, backend: str = "mujoco",
                 **task_overrides: Any) -> None:
        from sim.registry import make_env, task_config

        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.venv = make_env(task, SimConfig(backend=backend, num_envs=1, num_threads=1),
                             task_config(task, task_overrides))
        self.observation_space, self.action_space = _spaces(self.venv)
        self._dict = isinstance(self.observation_space, spaces.Dict)
        self.metadata = {**self.metadata, "render_fps": round(1.0 / self.venv.control_dt)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        # Without a seed, draw one from gymnasium's generator so reset sequences follow its seeding.
        env_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        obs, _ = self.venv.reset(seed=env_seed)
        return _to_numpy(obs, self._dict, 0), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        a = torch.as_tensor(np.asarray(action, dtype=np.float32)).reshape(1, -1)
        obs, reward, terminated, truncated, info = self.venv.step(a)
        success = bool(info[keys.SUCCESS][0])
        if bool(terminated[0] | truncated[0]):
            obs = info[keys.FINAL_OBS]  # the single-env API shows the last observation; reset() starts anew
            if keys.EPISODE in info:  # the episode's outcome, as sb3_vec_env and our runners count it
                success = bool(info[keys.EPISODE][keys.EP_SUCCESS][0])
        return _to_numpy(obs, self._dict, 0), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {
            "is_success": success}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self.venv.render().permute(0, 2, 3, 1)[0].numpy()

    def close(self) -> None:
        self.venv.close()


def sb3_vec_env(venv: VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over our batched env (SB3 is imported here, lazily: it is an extra)."""
    from stable_baselines3.common.vec_env.base_vec_env import VecEnv as SB3VecEnvBase

    class _Adapter(SB3VecEnvBase):
        """SB3's VecEnv API over ours: numpy out, auto-reset with ``terminal_observation`` in infos."""

        def __init__(self, venv: VecEnv) -> None:
            self.venv = venv
            obs_space, act_space = _spaces(venv)
            self._dict = isinstance(obs_space, spaces.Dict)
            super().__init__(venv.num_envs, obs_space, act_space)
            self._actions: np.ndarray | None = None
            self._seed: int | None = None

        def reset(self):
            obs, _ = self.venv.reset(seed=self._seed)
            self._seed = None
            return _to_numpy(obs, self._dict)

        def step_async(self, actions: np.ndarray) -> None:
            self._actions = actions

        def step_wait(self):
            a = torch.as_tensor(np.asarray(self._actions, dtype=np.float32)).reshape(self.num_envs, -1)
            obs, reward, terminated, truncated, info = self.venv.step(a.clamp(-1, 1))
            np_obs = _to_numpy(obs, self._dict)
            done = (terminated | truncated).cpu().numpy()
            term, trunc = terminated.cpu().numpy(), truncated.cpu().numpy()
            succ = info[keys.SUCCESS].cpu().numpy()
            infos = []
            for i in range(self.num_envs):
                d: dict[str, Any] = {"is_success": bool(succ[i])}
                if done[i]:
                    d["terminal_observation"] = _to_numpy(info[keys.FINAL_OBS], self._dict, i)
                    d["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
                    if keys.EPISODE in info:
                        ep = info[keys.EPISODE]
                        d["episode"] = {"r": float(ep[keys.EP_RETURN][i]), "l": int(ep[keys.EP_LENGTH][i])}
                        d["is_success"] = bool(ep[keys.EP_SUCCESS][i])
                infos.append(d)
            return np_obs, reward.cpu().numpy().astype(np.float32), done, infos

        def close(self) -> None:
            self.venv.close()

        def seed(self, seed: int | None = None):
            self._seed = seed
            return [seed] * self.num_envs

        def get_attr(self, attr_name: str, indices=None):
            if attr_name == "render_mode":  # SB3 asks at construction; frames come from render() of the batch
                return [getattr(self.venv, attr_name, None)] * len(self._indices(indices))
            return [getattr(self.venv, attr_name)] * len(self._indices(indices))

        def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
            setattr(self.venv, attr_name, value)

        def env_method(self, method_name: str, *args, indices=None, **kwargs):
            raise NotImplementedError("our batched env has no per-env methods")

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * len(self._indices(indices))

        def _indices(self, indices) -> list[int]:
            if indices is None:
                return list(range(self.num_envs))
            return [indices] if isinstance(indices, int) else list(indices)

    return _Adapter(venv)
