"""LeRobot's own ACT and Diffusion Policy as side-by-side baselines for our flow VLA (issue 14).

Two halves:

* ``train_lerobot_policy`` trains one of them from scratch with **LeRobot's own training code**: its
  ``lerobot-train`` entry (``python -m lerobot.scripts.lerobot_train``, the console script's module) in a
  subprocess, offline (no pretrained backbone, no hub, no wandb), for a wall-clock budget. A short calibration run
  of the same command measures LeRobot's start-up, seconds per step and checkpoint time; the real run then gets
  ``--steps`` sized to end inside the budget, and is stopped at the budget in any case (the last complete
  checkpoint is kept). LeRobot logs every step (``--log_freq=1``); the curve (loss vs step and wall time) and the
  peak RSS of the training process go to ``<out_dir>/train_record.json``.
* ``LeRobotPolicyAdapter`` / ``LeRobotHistoryAdapter`` wrap the trained folder (LeRobot's ``from_pretrained`` and
  its saved pre/post processors) into our ``Policy`` contract for batched evaluation over N envs.

Chosen settings (``ACT_SETTINGS``, ``DIFFUSION_SETTINGS``; LeRobot's defaults otherwise):

* ACT: ``chunk_size`` 20 (0.67 s at 30 Hz: the short episodes here last a few seconds, and ACT's default 100 steps
  would be most of one), ``n_action_steps`` 10 (replan every 1/3 s), ``pretrained_backbone_weights`` None (no
  download; ResNet-18 from scratch). Default lr 1e-5, batch 8, VAE on, kl_weight 10, dim_model 512.
* Diffusion: ``horizon`` 16, ``n_action_steps`` 8, ``n_obs_steps`` 2 (the original Diffusion Policy's short-horizon
  values), ``drop_n_last_frames`` 7 (= horizon - n_action_steps - n_obs_steps + 1), no pretrained backbone and
  GroupNorm instead of BatchNorm (the from-scratch recipe), no crop (the default; 64x64 images are small). Two changes
  that the 2-core CPU budget forces: the U-Net at half LeRobot's widths (``down_dims`` 256 / 512 / 1024: 89 M
  parameters with two 80x80 cameras, 0.84 s per training step at batch 8; LeRobot's 512 / 1024 / 2048, 278 M, took
  ~2.4 s with a collection beside it: 335 steps in 15 minutes, a sixth of ACT's, all inside LeRobot's 500-step lr
  warm-up), and DDIM sampling in 10 steps instead of DDPM's 100 (``noise_scheduler_type`` DDIM,
  ``num_inference_steps`` 10; training is the same noise prediction over 100 timesteps), the speed-up Chi et al.
  (Diffusion Policy, RSS 2023) use on real robots: with DDPM's 100 steps one chunk of the 278 M model took ~20 s for
  one env here, and evaluating 500 episodes would have taken hours (10 DDIM steps of the 89 M model: 0.17 s).

Neither policy reads the task text: in a multi-task dataset they tell tasks apart only from the images.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from policies.base import Policy
from policies.keys import TASK
from policies.processor import Features, Processor
from robot_rl import openmp_spin

KINDS = ("act", "diffusion")
ACT_SETTINGS: dict[str, Any] = {"policy.chunk_size": 20, "policy.n_action_steps": 10,
                                "policy.pretrained_backbone_weights": None}
DIFFUSION_SETTINGS: dict[str, Any] = {"policy.horizon": 16, "policy.n_action_steps": 8, "policy.n_obs_steps": 2,
                                      "policy.drop_n_last_frames": 7, "policy.pretrained_backbone_weights": None,
                                      "policy.use_group_norm": True, "policy.down_dims": [256, 512, 1024],
                                      "policy.noise_scheduler_type": "DDIM",
                                      "policy.num_inference_steps": 10}
TRAIN_RECORD = "train_record.json"  # written in out_dir
_MANAGED = ("steps", "save_freq", "output_dir", "log_freq", "save_checkpoint")  # set here, never by overrides


def diffusion_available() -> bool:
    """Whether LeRobot's Diffusion Policy can be built here (it needs ``diffusers``: ``lerobot[diffusion]``)."""
    return importlib.util.find_spec("diffusers") is not None


# ------------------------------------------------------------------------------------------------ training
@dataclass
class _Run:
    """One ``lerobot-train`` process as seen from outside. Times in seconds from its start."""

    returncode: int
    wall_s: float
    stopped_at_budget: bool
    peak_rss_mb: float  # ru_maxrss of the process (max over it and its reaped children, not their sum)
    curve: list[dict[str, float]] = field(default_factory=list)  # one entry per logged step
    info: dict[str, int] = field(default_factory=dict)  # num_learnable_params, dataset.num_frames, ...

    def first_step_s(self) -> float:
        return self.curve[0]["wall_s"]

    def median_step_s(self) -> float:
        """Seconds per step, median of the gaps between step logs after the first (which includes warm-up)."""
        times = [c["wall_s"] for c in self.curve]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return statistics.median(gaps) if gaps else times[0]


_INFO = re.compile(r"(num_learnable_params|num_total_params|dataset\.num_frames|dataset\.num_episodes)=(\d+)")
_TOKEN = re.compile(r"([\w/]+):(\S+)")


def parse_step_line(line: str) -> dict[str, float] | None:
    """LeRobot's per-step log (``step:12 smpl:96 ... loss:0.123 ... updt_s:0.9 data_s:0.1 l1_loss:...``) as
    numbers; None for any other line. ``step``/``smpl``/``ep`` are abbreviated there (``1K``) and left out."""
    at = line.find("step:")
    if at < 0 or " loss:" not in line or "updt_s:" not in line:
        return None
    out = {}
    for key, value in _TOKEN.findall(line[at:]):
        if key in ("step", "smpl", "ep"):
            continue
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out if "loss" in out else None


def _cli(settings: dict[str, Any]) -> list[str]:
    """draccus command-line arguments: None -> null, bools lower-case, sequences as [a,b]."""

    def fmt(v: Any) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(fmt(x) for x in v) + "]"
        return str(v)

    return [f"--{k}={fmt(v)}" for k, v in settings.items()]


def _run_lerobot_train(settings: dict[str, Any], log_path: Path, deadline_s: float | None) -> _Run:
    """Run ``lerobot-train`` with ``settings``; stop it (SIGTERM, SIGKILL 15 s later) at ``deadline_s``."""
    cmd = [sys.executable, "-m", "lerobot.scripts.lerobot_train", *_cli(settings)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    openmp_spin(env, openmp_loaded=False)  # the OpenMP spin `robot-rl offline` trains ours with: equal conditions
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env,
                            cwd=log_path.parent)
    pidfd = os.pidfd_open(proc.pid)  # signals through it can never reach a recycled pid
    stopped = threading.Event()

    def stop(sig: int) -> None:
        stopped.set()
        try:
            signal.pidfd_send_signal(pidfd, sig)
        except OSError:  # already gone (ProcessLookupError), or the fd closed as it ended
            pass

    timers = [] if deadline_s is None else [threading.Timer(deadline_s, stop, (signal.SIGTERM,)),
                                            threading.Timer(deadline_s + 15.0, stop, (signal.SIGKILL,))]
    for t in timers:
        t.daemon = True
        t.start()
    run = _Run(returncode=-1, wall_s=0.0, stopped_at_budget=False, peak_rss_mb=0.0)
    try:
        with log_path.open("w") as log:
            log.write(" ".join(cmd) + "\n")
            for line in proc.stdout:  # type: ignore[union-attr]
                now = time.perf_counter() - t0
                log.write(line)
                step = parse_step_line(line)
                if step is not None:
                    run.curve.append({"step": len(run.curve) + 1, "wall_s": round(now, 3), **step})
                run.info.update({k: int(v) for k, v in _INFO.findall(line)})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        for t in timers:
            t.cancel()
        if proc.returncode is None:  # interrupted here: do not leave the trainer running
            stop(signal.SIGKILL)
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        os.close(pidfd)
    run.returncode, run.wall_s = proc.returncode, time.perf_counter() - t0
    run.stopped_at_budget, run.peak_rss_mb = stopped.is_set(), usage.ru_maxrss / 1024
    return run


def _log_tail(path: Path, n: int = 25) -> str:
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-n:])


def _last_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``pretrained_model`` under ``run_dir/checkpoints``: LeRobot's ``last`` link when it is
    there, else the newest step folder whose ``training_state`` exists (LeRobot creates it only after every
    ``pretrained_model`` file is written)."""
    ckpts = run_dir / "checkpoints"
    if (ckpts / "last" / "pretrained_model" / "config.json").is_file():
        return (ckpts / "last" / "pretrained_model").resolve()
    done = sorted(p for p in ckpts.glob("[0-9]*") if (p / "training_state").is_dir())
    return (done[-1] / "pretrained_model") if done else None


def train_lerobot_policy(kind: str, dataset_root: str | Path, repo_id: str, out_dir: str | Path,
                         wall_clock_s: float, seed: int = 0, batch_size: int = 8,
                         overrides: dict[str, Any] | None = None, steps: int | None = None, device: str = "cpu",
                         num_workers: int = 0, calibration_steps: int = 6, checkpoints: int | None = None,
                         margin: float = 0.05) -> Path:
    """Train LeRobot's ``kind`` policy from scratch on a LeRobotDataset v3 with ``lerobot-train``, in a budget.

    The budget covers the whole training process: LeRobot's imports, dataset opening, model building, the steps
    (each decoding its video frames through LeRobot's loader) and the checkpoint writes. A calibration run of
    ``calibration_steps`` steps (same settings, its own output, deleted afterwards) comes first, outside the
    budget and recorded apart; it is skipped when ``steps`` is given. Evenly spaced checkpoints are written (the
    last at the final step) so that a run that overruns (the step time can change after calibration on a shared
    machine) still leaves a recent model when it is stopped at the budget; only the newest one is kept.

    Args:
        kind: "act" or "diffusion" (needs ``diffusers``, see ``diffusion_available``).
        dataset_root: the dataset folder (``meta/info.json`` inside); repo_id: its repo id.
        out_dir: created; holds ``run/`` (LeRobot's output dir), ``train.log`` and ``train_record.json``.
        wall_clock_s: the budget, seconds.
        seed: LeRobot's ``--seed`` (model init, data order).
        batch_size: LeRobot's ``--batch_size`` (its default is 8).
        overrides: more ``lerobot-train`` fields, dotted (``{"policy.dim_model": 64}``); they win over the kind's
            settings. ``steps``, ``save_freq``, ``output_dir``, ``log_freq`` and ``save_checkpoint`` are set here.
        steps: train exactly this many steps (still stopped at the budget) instead of sizing them by calibration.
        device: LeRobot's ``--policy.device``.
        num_workers: data-loader workers (0: decoding on the training process, whose RSS is then all of it).
        calibration_steps: steps of the calibration run (>= 3: the first includes warm-up).
        checkpoints: checkpoints written over the run (>= 1); None: as many as fit in 5 % of the budget at the
            calibrated seconds per checkpoint, 2 to 10 (1 when ``steps`` is given).
        margin: fraction of the budget kept free against the step time changing after calibration.

    Returns:
        The final ``pretrained_model`` folder (config, weights, pre/post processors), for ``load_lerobot_adapter``.

    Raises:
        ValueError: unknown kind, managed keys in ``overrides``, or a budget too small for one step.
        RuntimeError: a missing LeRobot extra, or ``lerobot-train`` failed (its log tail in the message).
        FileExistsError: ``out_dir/run`` exists (LeRobot refuses to overwrite a run).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if importlib.util.find_spec("accelerate") is None:
        raise RuntimeError("lerobot-train needs accelerate, which is not installed: pip install 'lerobot[training]'")
    if kind == "diffusion" and not diffusion_available():
        raise RuntimeError("LeRobot's Diffusion Policy needs diffusers, which is not installed: "
                           "pip install 'lerobot[diffusion]'")
    bad = sorted(set(overrides or {}) & set(_MANAGED))
    if bad:
        raise ValueError(f"overrides may not set {bad}: train_lerobot_policy sets them (use its steps argument)")
    if calibration_steps < 3 or (checkpoints is not None and checkpoints < 1) or not 0 <= margin < 1 or \
            wall_clock_s <= 0:
        raise ValueError(f"need calibration_steps >= 3 ({calibration_steps}), checkpoints >= 1 ({checkpoints}), "
                         f"0 <= margin < 1 ({margin}), wall_clock_s > 0 ({wall_clock_s})")
    dataset_root, out_dir = Path(dataset_root).resolve(), Path(out_dir).resolve()
    if not (dataset_root / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"{dataset_root}: not a LeRobotDataset (no meta/info.json)")
    run_dir = out_dir / "run"
    if run_dir.exists():
        raise FileExistsError(f"{run_dir} exists: LeRobot will not overwrite a run; pick another out_dir")
    from lerobot.utils.import_utils import get_safe_default_video_backend

    settings: dict[str, Any] = {
        "dataset.repo_id": repo_id, "dataset.root": str(dataset_root),
        "dataset.video_backend": get_safe_default_video_backend(),  # pyav where torchcodec cannot load
        "policy.type": kind, "policy.device": device, "policy.push_to_hub": False, "wandb.enable": False,
        "batch_size": batch_size, "num_workers": num_workers, "seed": seed, "log_freq": 1,
        **(ACT_SETTINGS if kind == "act" else DIFFUSION_SETTINGS), **(overrides or {})}
    record: dict[str, Any] = {"kind": kind, "repo_id": repo_id, "dataset_root": str(dataset_root),
                              "wall_clock_budget_s": wall_clock_s, "settings": dict(settings), "calibration": None}
    out_dir.mkdir(parents=True, exist_ok=True)

    if steps is None:  # calibrate: start-up, seconds per step, seconds per checkpoint
        cal_dir = out_dir / "calibration"
        shutil.rmtree(cal_dir, ignore_errors=True)
        cal = _run_lerobot_train({**settings, "steps": calibration_steps, "save_freq": 0,
                                  "output_dir": str(cal_dir / "run")}, cal_dir / "train.log", wall_clock_s)
        if cal.returncode != 0 or len(cal.curve) != calibration_steps:
            why = f"took over the {wall_clock_s:.0f} s budget" if cal.stopped_at_budget else f"exit {cal.returncode}"
            raise RuntimeError(f"lerobot-train calibration failed ({why}); "
                               f"{cal_dir / 'train.log'} ends:\n{_log_tail(cal_dir / 'train.log')}")
        step_s = cal.median_step_s()
        startup_s = max(0.0, cal.first_step_s() - step_s)  # the first step's warm-up counts as start-up
        save_s = max(0.0, cal.wall_s - cal.curve[-1]["wall_s"])  # final checkpoint + shutdown
        shutil.rmtree(cal_dir / "run", ignore_errors=True)
        record["calibration"] = {"steps": calibration_steps, "wall_s": round(cal.wall_s, 2),
                                 "startup_s": round(startup_s, 2), "step_s": round(step_s, 4),
                                 "checkpoint_s": round(save_s, 2), "peak_rss_mb": round(cal.peak_rss_mb, 1)}
        if checkpoints is None:
            checkpoints = min(10, max(2, math.floor(0.05 * wall_clock_s / max(save_s, 1e-3))))
        usable = wall_clock_s * (1 - margin) - startup_s - checkpoints * save_s
        steps = math.floor(usable / step_s)
        if steps < 1:
            raise ValueError(f"a {wall_clock_s:.0f} s budget leaves no step: start-up {startup_s:.1f} s, "
                             f"{checkpoints} checkpoints x {save_s:.1f} s, {step_s:.2f} s per step")
    checkpoints = checkpoints or 1
    save_freq = math.ceil(steps / checkpoints) if checkpoints > 1 else 0
    main = _run_lerobot_train({**settings, "steps": steps, "save_freq": save_freq, "output_dir": str(run_dir)},
                              out_dir / "train.log", wall_clock_s)
    if main.returncode != 0 and not main.stopped_at_budget:
        raise RuntimeError(f"lerobot-train failed (exit {main.returncode}); {out_dir / 'train.log'} ends:\n"
                           f"{_log_tail(out_dir / 'train.log')}")
    final = _last_checkpoint(run_dir)
    if final is None:
        raise RuntimeError(f"lerobot-train left no complete checkpoint in {run_dir} within {wall_clock_s:.0f} s "
                           f"({len(main.curve)} steps logged); see {out_dir / 'train.log'}")
    for old in (run_dir / "checkpoints").glob("[0-9]*"):  # ~0.6 GB each for ACT: keep the final one only
        if old != final.parent:
            shutil.rmtree(old)
    steps_in_model = int(final.parent.name)  # LeRobot names checkpoint folders by step
    record.update({
        "steps_planned": steps, "checkpoints": checkpoints, "save_freq": save_freq, "steps_logged": len(main.curve),
        "steps_in_model": steps_in_model, "stopped_at_budget": main.stopped_at_budget,
        "wall_s": round(main.wall_s, 2), "peak_rss_mb": round(main.peak_rss_mb, 1),
        "first_step_at_s": round(main.first_step_s(), 2) if main.curve else None,  # start-up + first step
        "step_s_median": round(main.median_step_s(), 4) if main.curve else None,
        "pretrained_model": str(final), **main.info, "curve": main.curve,
        "versions": {m: importlib.metadata.version(m) for m in ("lerobot", "torch", "accelerate")}})
    (out_dir / TRAIN_RECORD).write_text(json.dumps(record, indent=1))
    return final


# ------------------------------------------------------------------------------------------------ evaluation
def _read_config(path: Path) -> Any:
    """The policy config saved in a LeRobot ``pretrained_model`` folder (LeRobot's own reader leaves a temporary file
    per call: ``real.lerobot_policy.read_config``)."""
    from real.lerobot_policy.read_config import read_policy_config

    return read_policy_config(path)


def _load_lerobot(path: str | Path, device: str | torch.device) -> tuple[Any, Any, Any]:
    """LeRobot's policy (eval mode, strict weight loading) and its saved pre/post processors, on ``device``."""
    from lerobot.policies import get_policy_class, make_pre_post_processors

    path = Path(path)
    cfg = _read_config(path)
    cfg.device = str(device)
    policy = get_policy_class(cfg.type).from_pretrained(path, config=cfg, strict=True).to(device).eval()
    on_device = {"device_processor": {"device": str(device)}}
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(path), preprocessor_overrides=on_device,
                                         postprocessor_overrides=on_device)
    return policy, pre, post


def _features(cfg: Any) -> Features:
    return Features(inputs={k: list(f.shape) for k, f in cfg.input_features.items()},
                    action_dim=int(cfg.action_feature.shape[0]))


def _frame_to_batch(obs: dict[str, Any], cfg: Any, processor: Processor, device: torch.device) -> dict[str, Any]:
    """Our frame (state float32 [N, D] degrees, images uint8 [N, 3, H, W] or float [0, 1], optional task list[str])
    as LeRobot's training batch holds it: float32 on ``device``, images in [0, 1], the task kept as a list."""
    from lerobot.configs.types import FeatureType

    processor.check(obs)
    n = obs[next(iter(cfg.input_features))].shape[0]
    batch: dict[str, Any] = {}
    for key, feat in cfg.input_features.items():
        x = obs[key]
        if x.shape[0] != n:
            raise ValueError(f"{key} holds {x.shape[0]} envs, {next(iter(cfg.input_features))} holds {n}")
        if feat.type is FeatureType.VISUAL:
            if x.dtype == torch.uint8:
                x = x.to(device, torch.float32) / 255.0
            elif not x.is_floating_point():
                raise TypeError(f"{key}: images must be uint8 or float in [0, 1], got {x.dtype}")
        batch[key] = x.to(device, torch.float32)
    if TASK in obs:
        if len(obs[TASK]) != n:
            raise ValueError(f"{TASK} holds {len(obs[TASK])} instructions for {n} envs")
        batch[TASK] = list(obs[TASK])
    return batch


class LeRobotPolicyAdapter(Policy):
    """A trained LeRobot policy that reads one observation per query (ACT) as our chunking ``Policy``.

    ``act`` returns the whole predicted chunk [N, H, A] (H = the policy's ``chunk_size``) and
    ``executed_steps`` = its ``n_action_steps``: ``policies.ActionQueue`` executes each env's chunk and asks
    again for that env only, which is what LeRobot's ``select_action`` does for one env. LeRobot's own queue
    is one deque shared by the whole batch (all envs replan together, and its ``reset`` clears every env), so
    it is not used: ``predict_action_chunk`` keeps no state between calls, the queue lives per env in
    ``ActionQueue``, and ``reset`` has nothing to clear. ACT in eval mode is deterministic (zero VAE latent).

    Input: our frame, ``observation.state`` float32 [N, 6] degrees, ``observation.images.<cam>`` uint8
    [N, 3, H, W] (float in [0, 1] accepted), optional ``task`` list[str] (ACT ignores it). Output: joint position
    targets in degrees (LeRobot's postprocessor unnormalises with the dataset statistics), not [-1, 1].
    """

    type_name: ClassVar[str] = "lerobot"
    config_class: ClassVar[type] = dict

    def __init__(self, path: str | Path, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.path = Path(path)
        self.lerobot, self.pre, self.post = _load_lerobot(path, device)
        self.cfg = self.lerobot.config
        if self.cfg.observation_delta_indices is not None:
            raise ValueError(f"{path}: this {self.cfg.type} policy reads observation histories; use "
                             "LeRobotHistoryAdapter (load_lerobot_adapter picks it)")
        if getattr(self.cfg, "temporal_ensemble_coeff", None) is not None:
            raise ValueError(f"{path}: LeRobot's temporal ensembler keeps one state for the whole batch; load the "
                             "policy without it and run ActionQueue(temporal_ensemble=m), which ensembles per env")
        self.processor = Processor(_features(self.cfg))
        self._horizon, self._executed = int(self.cfg.chunk_size), int(self.cfg.n_action_steps)

    @property
    def horizon(self) -> int:
        return self._horizon

    @property
    def executed_steps(self) -> int:
        return self._executed

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = True) -> torch.Tensor:
        """Action chunks [N, H, A] in degrees."""
        batch = self.pre(_frame_to_batch(obs, self.cfg, self.processor, self.device))
        chunk = self.post(self.lerobot.predict_action_chunk(batch)).to(self.device, torch.float32)
        if chunk.ndim != 3 or chunk.shape[1] != self._horizon:
            raise ValueError(f"{self.cfg.type} returned a chunk of shape {tuple(chunk.shape)}, expected "
                             f"[N, {self._horizon}, A]")
        return chunk

    def save(self, path: str | Path) -> None:
        """Copy LeRobot's folder (config, weights, processors): it is the exported form."""
        shutil.copytree(self.path, path, dirs_exist_ok=True)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> LeRobotPolicyAdapter:
        return cls(path, device)


class LeRobotHistoryAdapter(Policy):
    """A trained LeRobot policy that reads the last ``n_obs_steps`` observations (Diffusion Policy) as a step
    ``Policy`` (``horizon`` 1): it must see every step's observation, which ``ActionQueue`` gives a chunking
    policy only when that env's queue runs out.

    Per env it keeps what LeRobot's ``select_action`` keeps for its one shared batch: the last ``n_obs_steps``
    normalised observations (an env's first observation after ``reset`` fills every slot, as LeRobot's
    ``populate_queues`` does) and a queue of ``n_action_steps`` actions; envs whose queue is empty get a new chunk
    from ``predict_action_chunk`` on their stacked history (the policy's own queues stay empty, so it reads the
    batch directly). ``reset(env_ids)`` clears those envs only. Diffusion samples its noise: ``deterministic`` is
    not honoured. A policy without histories (ACT) runs here too, with a history of one.
    """

    type_name: ClassVar[str] = "lerobot_history"
    config_class: ClassVar[type] = dict

    def __init__(self, path: str | Path, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.path = Path(path)
        self.lerobot, self.pre, self.post = _load_lerobot(path, device)
        self.cfg = self.lerobot.config
        self.processor = Processor(_features(self.cfg))
        self.stacked = self.cfg.observation_delta_indices is not None  # trained on [B, n_obs, ...] batches
        self.n_obs = int(self.cfg.n_obs_steps) if self.stacked else 1
        self.n_act = int(self.cfg.n_action_steps)
        self.history: dict[str, torch.Tensor] = {}  # key -> [N, n_obs, ...], normalised
        self.fresh = torch.ones(0, dtype=torch.bool)  # [N] history empty (episode start)
        self.queue = torch.zeros(0)  # [N, n_act, A] degrees
        self.pos = torch.zeros(0, dtype=torch.long)  # [N] next action in the queue; n_act = empty

    @torch.no_grad()
    def act(self, obs: dict[str, Any], deterministic: bool = True) -> torch.Tensor:
        """The action [N, A] in degrees for this step."""
        batch = self.pre(_frame_to_batch(obs, self.cfg, self.processor, self.device))
        current = {k: batch[k] for k in self.cfg.input_features}
        n = next(iter(current.values())).shape[0]
        if self.pos.shape[0] != n:
            self._allocate(n, current)
        for key, x in current.items():
            self.history[key] = push_history(self.history[key], x, self.fresh)
        self.fresh.zero_()
        need = (self.pos >= self.n_act).nonzero().flatten()
        if len(need):
            sub = {k: (h[need] if self.stacked else h[need, -1]) for k, h in self.history.items()}
            chunk = self.post(self.lerobot.predict_action_chunk(sub)).to(self.device, torch.float32)
            if chunk.ndim != 3 or chunk.shape[1] < self.n_act or chunk.shape[0] != len(need):
                raise ValueError(f"{self.cfg.type} returned a chunk of shape {tuple(chunk.shape)} for {len(need)} "
                                 f"envs, expected [{len(need)}, >= {self.n_act}, A]")
            self.queue[need] = chunk[:, : self.n_act]
            self.pos[need] = 0
        action = self.queue[torch.arange(n, device=self.device), self.pos]
        self.pos += 1
        return action

    def _allocate(self, n: int, current: dict[str, torch.Tensor]) -> None:
        self.history = {k: x.new_zeros((n, self.n_obs, *x.shape[1:])) for k, x in current.items()}
        self.fresh = torch.ones(n, dtype=torch.bool, device=self.device)
        self.queue = torch.zeros(n, self.n_act, int(self.cfg.action_feature.shape[0]), device=self.device)
        self.pos = torch.full((n,), self.n_act, dtype=torch.long, device=self.device)

    def reset(self, env_ids: torch.Tensor | None = None) -> None:
        if self.pos.shape[0] == 0:
            return
        ids = slice(None) if env_ids is None else env_ids.to(self.device)
        self.fresh[ids] = True
        self.pos[ids] = self.n_act

    def save(self, path: str | Path) -> None:
        """Copy LeRobot's folder (config, weights, processors): it is the exported form."""
        shutil.copytree(self.path, path, dirs_exist_ok=True)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> LeRobotHistoryAdapter:
        return cls(path, device)


def push_history(history: torch.Tensor, x: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """The history [N, T, ...] shifted one step with ``x`` [N, ...] appended; rows where ``fresh`` [N] is set
    become ``x`` in every slot (an episode's first observation stands in for the ones before it)."""
    out = torch.cat([history[:, 1:], x.unsqueeze(1)], dim=1)
    out[fresh] = x[fresh].unsqueeze(1).expand(-1, history.shape[1], *x.shape[1:])
    return out


def load_lerobot_adapter(path: str | Path, device: str | torch.device = "cpu") -> Policy:
    """The adapter a trained LeRobot folder needs: ``LeRobotHistoryAdapter`` for policies trained on observation
    histories (Diffusion), else the chunking ``LeRobotPolicyAdapter`` (ACT)."""
    stacked = _read_config(Path(path)).observation_delta_indices is not None
    return (LeRobotHistoryAdapter if stacked else LeRobotPolicyAdapter)(path, device)


__all__ = ["ACT_SETTINGS", "DIFFUSION_SETTINGS", "KINDS", "TRAIN_RECORD", "LeRobotHistoryAdapter",
           "LeRobotPolicyAdapter", "diffusion_available", "load_lerobot_adapter", "parse_step_line", "push_history",
           "train_lerobot_policy"]
