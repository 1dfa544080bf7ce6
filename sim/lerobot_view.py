"""``LeRobotView``: an SO-101 task env seen in LeRobot's frame convention, the contract of the VLA, the dataset
writer and ``robot-rl eval`` of a VLA.

    env = make_env("so101_pick", SimConfig(num_envs=16))            # the task itself configures no cameras
    view = LeRobotView(env, cameras=("front", "wrist"), image_size=(64, 64))
    frame, info = view.reset(seed=0)
    # frame = {"observation.state": float32 [N, 6] degrees, "observation.images.front": uint8 [N, 3, 64, 64],
    #          "observation.images.wrist": ..., "task": ["pick up the green cube", ...]}
    frame, reward, terminated, truncated, info = view.step(targets_deg)   # absolute joint targets, degrees [N, 6]

A scripted expert acts from the inner env's observation and its action is recorded as the LeRobot ``action``:

    expert = make_expert(view.env)
    env_action = expert.act(view.env_obs)           # the inner env's normalised action [N, 6]
    action_deg = view.to_target(env_action)         # the joint targets it commands, degrees [N, 6]
    frame, *_ = view.step(action_deg)               # the expert's own trajectory, bit for bit

Images dominate the cost here (on 2 CPU cores, ~4 ms per 64x64 frame against ~1 ms of physics for 16 envs), so the
view renders only what its consumer asks for: set ``view.render_ids`` before a step or reset -- None or True: every
env (the default), False: none, int [K] env ids: only those rows (the others are zeros), plus, on a step, every env
that auto-reset in it (a consumer always reads a new episode's first frame) -- and it holds for that one call, then
returns to the default. Final frames of ended episodes carry state and task only, never images.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from policies import keys
from robot_rl.env import Obs, ObsSpec, VecEnv, check_action, nonfinite_rows
from sim import so101
from sim.env import MujocoFamilyEnv
from sim.tasks import common

Frame = dict[str, Any]  # LeRobot's frame: tensors under OBS_STATE and the image keys, list[str] under TASK


class LeRobotView(VecEnv):
    """An SO-101 ``MujocoFamilyEnv`` in LeRobot's units: degrees in and out, uint8 images, task strings.

    Args:
        env: the inner env, an SO-101 task (so101_reach, so101_lift, so101_push, so101_pick) on any MuJoCo-family
            backend, with no cameras configured in its task (the view renders them, once, on the steps asked for).
        cameras: cameras of the SO-101 scene to show, in order ("front", "wrist").
        image_size: (height, width) of every image, px.

    Attributes:
        env: the inner env.
        env_obs: the inner env's latest observation dict (what a scripted expert acts from); None before a reset.
        render_ids: which envs the next step or reset renders (see the module docstring).
    """

    def __init__(self, env: MujocoFamilyEnv, cameras: Sequence[str] = ("front", "wrist"),
                 image_size: tuple[int, int] = (64, 64)) -> None:
        task = getattr(env, "task", None)
        if not isinstance(getattr(task, "arm", None), so101.SO101Arm) or env.action_dim != len(so101.JOINT_NAMES):
            raise TypeError(f"LeRobotView shows an SO-101 task env (so101_reach/lift/push/pick); got "
                            f"{type(env).__name__} of task {getattr(task, 'name', None)!r}")
        if task.cameras():
            raise ValueError(f"task {task.name!r} already renders cameras {task.cameras()} into every observation; "
                             "build the inner env with cameras=[] (task_config(name, {'cameras': []})): the view "
                             "renders its own cameras, only on the steps a consumer asks for")
        cameras = tuple(cameras)
        common.validate_cameras(list(cameras))
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras must be distinct, got {list(cameras)}")
        if len(image_size) != 2 or min(int(image_size[0]), int(image_size[1])) < 1:
            raise ValueError(f"image_size must be (height, width) in px, both >= 1, got {image_size}")
        self.env, self.cameras = env, cameras
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.arm: so101.SO101Arm = task.arm
        self.num_envs, self.device = env.num_envs, env.device
        self.action_dim = len(so101.JOINT_NAMES)
        self.max_episode_length, self.control_dt = env.max_episode_length, env.control_dt
        h, w = self.image_size
        image_keys = [keys.lerobot_image_key(c) for c in cameras]
        self.obs_spec = ObsSpec({keys.OBS_STATE: (self.action_dim,), **{k: (3, h, w) for k in image_keys}},
                                dtypes=dict.fromkeys(image_keys, torch.uint8))
        self.render_ids: torch.Tensor | bool | None = None
        self.env_obs: Obs | None = None
        self._memory: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # to_target's (q, deg, action)

    @property
    def instructions(self) -> list[str]:
        """[N] the instruction of each env's current episode."""
        return self.env.instructions

    @property
    def autoreset(self) -> bool:  # type: ignore[override]
        return self.env.autoreset

    # -------------------------------------------------------------------------------------------- contract
    def reset(self, seed: int | None = None, env_ids: torch.Tensor | None = None) -> tuple[Frame, dict[str, Any]]:
        """Reset like the inner env; returns the frame of all N envs (images as ``render_ids`` says) and its info."""
        ids = self._take_render_ids()
        obs, info = self.env.reset(seed=seed, env_ids=env_ids)
        self.env_obs = obs
        return self._frame(obs, self.env.instructions, ids), info

    def step(self, action: torch.Tensor, actor: int | torch.Tensor | None = None
             ) -> tuple[Frame, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Command absolute joint targets and advance every env one control step.

        Args:
            action: float [N, 6] joint position targets in degrees (LeRobot's ``action``), converted with
                ``SO101Arm.ctrl_to_action(measured q, deg_to_rad(target))``; targets beyond the per-step cap or
                the joint limits are clipped like the inner env clips its actions. A row holding NaN or inf follows
                the inner env's ``on_nonfinite_action`` (an error, or that env terminated and reset).
            actor: who chose the action (``keys.ACTOR_*``), passed to the inner env.

        Returns:
            ``(frame, reward, terminated, truncated, info)``: the frame after the step (after auto-reset: the new
            episode's, with its instruction), the inner env's [N] tensors and its info, where
            ``info[FINAL_OBS]`` is ``{OBS_STATE: float32 [N, 6] degrees, TASK: list[str]}`` of each env's last
            frame (the ended episode's for envs that ended, no images) and ``info[ACTION_COL]`` float32 [N, 6] the
            targets really commanded in degrees (clipped; a rejected row holds the previous targets).
        """
        ids = self._take_render_ids()
        target = check_action(action, self.num_envs, self.action_dim).to(self.device)
        env_action = self._action_from_target(target)
        commanded = self._commanded(env_action)
        tasks = list(self.env.instructions)  # the running episodes': the ended ones' final task
        obs, reward, terminated, truncated, info = self.env.step(env_action, actor)
        self.env_obs = obs
        final = info[keys.FINAL_OBS]
        info[keys.FINAL_OBS] = {keys.OBS_STATE: self._state_deg(final), keys.TASK: tasks}
        info[keys.ACTION_COL] = commanded
        if ids is not None and self.env.autoreset:  # an env that started a new episode is always rendered: a
            restarted = (terminated | truncated).nonzero().flatten().cpu()  # consumer reads its first frame
            ids = torch.unique(torch.cat([ids, restarted]))
        return self._frame(obs, self.env.instructions, ids), reward, terminated, truncated, info

    def to_target(self, env_action: torch.Tensor) -> torch.Tensor:
        """float32 [N, 6] degrees: the joint targets the inner-env action ``env_action`` (float [N, 6] in [-1, 1],
        e.g. a scripted expert's) commands from the current state -- what a dataset records as its ``action``.

        float32 degrees cannot hold every float32 radian target (converting back may move one by a float32 step,
        ~1e-7 rad), so the view remembers this call: in the next ``step``, rows given exactly these degrees from the
        same joint positions apply ``env_action`` itself, and the recorded episode is the expert's trajectory bit
        for bit.
        """
        a = check_action(env_action, self.num_envs, self.action_dim).to(self.device)
        deg = self._to_deg(self._targets(a.clamp(-1.0, 1.0)))
        deg[nonfinite_rows(a)] = float("nan")
        self._memory = (self._measured(), deg.clone(), a.clone())
        return deg

    def render(self, camera: str | None = None, width: int | None = None, height: int | None = None,
               env_ids: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 [N, 3, H, W] frames of a camera (default: the view's first) at the view's image size unless
        ``width``/``height`` are given (a video), of the envs ``env_ids`` (default: all)."""
        h, w = self.image_size
        return self.env.render(camera or self.cameras[0], width or w, height or h, env_ids)

    def render_many(self, cameras: list[str], env_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """{camera: uint8 [N, 3, H, W]} at the view's image size, of the envs ``env_ids`` (default: all); each env
        is loaded once for all cameras (``MujocoFamilyEnv.render_many``)."""
        h, w = self.image_size
        return self.env.render_many(list(cameras), w, h, env_ids)

    def close(self) -> None:
        self.env.close()

    # ------------------------------------------------------------------------------------------- internals
    def _measured(self) -> torch.Tensor:
        """float32 [N, 6] rad: the measured joint positions, those the inner env's action mapping starts from (the
        simulator's own, without the observation noise that randomization may add to ``proprio``)."""
        return self.arm.qpos(self.env.physics.state.qpos).to(self.device)

    def _targets(self, env_action: torch.Tensor) -> torch.Tensor:
        """float32 [N, 6] rad: the joint targets the inner env computes from ``env_action`` in [-1, 1]."""
        state = self.env.physics.state
        ctrl = self.arm.action_to_ctrl(state.qpos, state.ctrl, env_action.to(state.qpos.device))
        return ctrl[:, self.arm.act_idx].float().to(self.device)

    @staticmethod
    def _to_deg(rad: torch.Tensor) -> torch.Tensor:
        """float32 degrees of float32 radians, rounded once (through float64)."""
        return (rad.double() * (180.0 / math.pi)).float()

    def _action_from_target(self, target: torch.Tensor) -> torch.Tensor:
        """The inner env's action [N, 6] for joint targets in degrees; rows with a NaN or inf are NaN."""
        q = self._measured()
        action = self.arm.ctrl_to_action(q, so101.deg_to_rad(target))
        action[nonfinite_rows(target)] = float("nan")
        if self._memory is not None:  # rows of the last to_target given back from where it was asked: its action
            q_then, deg, remembered = self._memory
            self._memory = None
            same = (target == deg).all(dim=1) & (q == q_then).all(dim=1)
            action[same] = remembered[same]
        return action

    def _commanded(self, env_action: torch.Tensor) -> torch.Tensor:
        """float32 [N, 6] degrees the inner env will command for ``env_action`` (a NaN row keeps its targets)."""
        bad = nonfinite_rows(env_action)
        targets = self._targets(torch.nan_to_num(env_action).clamp(-1.0, 1.0))
        if bool(bad.any()):
            held = self.env.physics.state.ctrl[:, self.arm.act_idx].float().to(self.device)
            targets = torch.where(bad[:, None], held, targets)
        return self._to_deg(targets)

    def _state_deg(self, obs: Obs) -> torch.Tensor:
        return self._to_deg(obs[keys.PROPRIO])

    def _take_render_ids(self) -> torch.Tensor | None:
        """The envs to render on this call (None: all), read from ``render_ids``, which returns to the default."""
        ids, self.render_ids = self.render_ids, None
        if ids is None or ids is True:
            return None
        if ids is False:
            return torch.zeros(0, dtype=torch.long)
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dim() != 1:
            raise ValueError(f"render_ids must be None, True, False or a 1-D tensor of env ids (or a bool mask "
                             f"[{self.num_envs}]), got {ids!r}")
        if ids.dtype == torch.bool:
            if ids.numel() != self.num_envs:
                raise ValueError(f"a render_ids mask must have {self.num_envs} entries, got {ids.numel()}")
            return ids.nonzero().flatten().cpu()
        ids = ids.long().cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_envs):
            raise ValueError(f"render_ids must lie in [0, {self.num_envs}), got {ids.tolist()}")
        return ids

    def _frame(self, obs: Obs, tasks: list[str], ids: torch.Tensor | None) -> Frame:
        frame: Frame = {keys.OBS_STATE: self._state_deg(obs)}
        h, w = self.image_size
        cams = list(self.cameras)
        if ids is None:
            images = self.render_many(cams)
        else:
            images = {c: torch.zeros(self.num_envs, 3, h, w, dtype=torch.uint8) for c in cams}
            if ids.numel():
                for c, img in self.render_many(cams, ids).items():
                    images[c][ids] = img
        for cam in cams:
            frame[keys.lerobot_image_key(cam)] = images[cam].to(self.device)
        frame[keys.TASK] = list(tasks)
        return frame
