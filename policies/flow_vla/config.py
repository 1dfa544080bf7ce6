"""FlowVLAConfig: the architecture, the task vocabulary and the sampling settings of a flow-matching VLA."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from policies.flow_vla.flow import SAMPLE_REDUCTIONS

CONDITION_KEY = "advantage_indicator"  # batch / frame key: float or bool [B], RECAP's "good action" indicator
# Dataset statistics entry of the chunk relative to the state: {"mean", "std"} [H, A] (see ``relative_chunk_stats``).
RELATIVE_STATS_KEY = "action.relative_to_state"
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"  # token ids 0 and 1; the vocabulary's words take ids 2, 3, ...


@dataclass
class FlowVLAConfig:
    """A multi-task image + language + proprio policy with a flow-matching action expert over chunks [H, A].

    The vocabulary (the words of the training task strings, ``encoders.build_vocab``) is part of the config, so a
    saved policy tokenises exactly as it was trained.
    """

    # The value a key takes when a saved config lacks it: options added later whose default is not what files
    # written before them were built with (``policies.persistence.load_policy_as`` applies these).
    ABSENT_KEY_DEFAULTS: ClassVar[dict[str, object]] = {"fine_keypoints": False, "mean_of_samples": 1}

    cameras: list[str] = field(default_factory=lambda: ["front", "wrist"])  # reads observation.images.<camera>
    image_size: list[int] = field(default_factory=lambda: [64, 64])  # [H, W] pixels of every camera's images
    state_dim: int = 6  # P, observation.state (joint positions, degrees)
    action_dim: int = 6  # A, joint position targets (degrees)
    horizon: int = 16  # H, actions per chunk
    executed_steps: int = 8  # actions of a chunk executed before asking again (1..H)
    # Per instruction (the task string, matched as ``task_key`` normalises it): executed steps that replace
    # ``executed_steps`` for episodes of that task, for tasks whose best value differs (vla_bc, same weights: lift
    # 0.75-0.80 at 8 vs 0.40 at 3 steps, push 0.75 at 3 vs 0.40 at 8 on validation in earlier passes). Chosen per task
    # on 40 validation episodes it gained nothing over one value on the 2026-12-03 pass (mean 0.44 vs 0.47 over the
    # 4 tasks; vla_bc.json, per_task_executed_steps_2026_12_03): at that size validation ties and noise decide.
    executed_steps_by_task: dict[str, int] = field(default_factory=dict)
    # ACT's temporal ensembling (``policies.execution.ActionQueue``): when set, each env asks for a chunk every
    # executed steps (its task's) and executes, at each step, the mean of every chunk's prediction for it weighted
    # exp(-m * i), oldest first (ACT: m = 0.01). None: each chunk's first executed steps run as a queue.
    temporal_ensemble: float | None = None
    # Per instruction (matched as ``executed_steps_by_task``): m, or None for the queue, replacing
    # ``temporal_ensemble`` for that task. vla_bc chooses it per task on validation seeds: push gained from
    # ensembling (0.92 vs 0.81 on the same weights), lift and pick lost (vla_bc.json).
    temporal_ensemble_by_task: dict[str, float | None] = field(default_factory=dict)
    vocab: list[str] = field(default_factory=list)  # task words (lower case), ids 2.. ; others map to <unk>
    max_words: int = 16  # L, longest instruction in words; longer ones are refused
    # Image encoder, one per camera: 3x3 convs (ReLU) then spatial softmax -> 2 coordinates per channel. At 64x64
    # the default ends on 8x8 maps; stride 1 in the third conv (16x16) cost 2.5x the training time.
    conv_channels: list[int] = field(default_factory=lambda: [32, 32, 64, 64])  # output channels per conv
    conv_strides: list[int] = field(default_factory=lambda: [2, 2, 2, 1])  # stride per conv
    image_feature_dim: int = 128  # per-camera feature size after the keypoint projection
    # Also keypoints from the second conv's map (16x16 at 64x64; with 3 convs or more), for finer positions. vla_bc's
    # full pass (100 episodes per task; data recorded before c67908a fixed the visual DR that rendered the cubes grey;
    # reach / lift / push / pick): 0.45 / 0.67 / 0.51 / 0.40 with vs 0.09 / 0.71 / 0.51 / 0.36 without, at no
    # measurable cost per update or per chunk on the CPU (vla_bc.json's previous_pass_grey_visual_dr). Policies saved
    # before the option lack the key and load without it (``ABSENT_KEY_DEFAULTS``).
    fine_keypoints: bool = True
    # Pixels of training-time random translation of images (DrQ), 0: off. Off by default: where the action depends on
    # where things are in the image, a shift is label noise (a synthetic two-cube grounding task at 64x64 ended at a
    # 2x larger final-step error with 4 px than with none, 800 steps).
    random_shift: int = 0
    # Photometric augmentation in training (brightness, contrast, saturation, per-channel gains, each up to this
    # fraction; ``encoders.color_jitter``), 0: off. Off by default: on so101_lift alone under vla_bc's visual DR
    # (3,000 steps, 40 validation episodes) 0.3 gave 0.58 / 0.60 at 4 / 8 executed steps vs 0.40 / 0.63 without, and
    # did worse on the nominal look; with the wrist camera on its mount, 0.38 / 0.40 vs 0.63 / 0.70 at 1,500 steps
    # (vla_bc.json, "visual_dr_single_task_lift_2026_12_03"). For real-camera data
    # (exposure, white balance) it is the usual remedy.
    color_jitter: float = 0.0
    # Std of Gaussian noise added to the normalised state in training (0: off), so the expert cannot copy the
    # joints it is given forward into the chunk and ignore the cameras (the "copycat" failure of behaviour cloning
    # with proprioception; Wen et al. 2020, "Fighting Copycat Agents in Behavioral Cloning from Observation Histories").
    # Off by default: on vla_bc's data at 3,000 steps, mean success at 8 executed steps 0.38 with none, 0.34 at 0.3 and
    # 0.36 at 1.0, and lower at 4 executed steps (vla_bc.json, "state_noise_trial_2026_12_03").
    state_noise: float = 0.0
    # Language encoder: word + position embeddings, attention-pooled by a learned query.
    text_dim: int = 64  # word embedding size
    # Action expert: residual MLP over the flattened noisy chunk, FiLM-conditioned on time (+ condition).
    hidden_dim: int = 256  # units per residual block
    num_blocks: int = 3  # residual blocks
    time_dim: int = 64  # sinusoidal time embedding size (even)
    # Flow matching (policies/flow_vla/flow.py).
    num_steps: int = 10  # Euler steps at sampling
    time_alpha: float = 1.5  # t = time_scale · Beta(time_alpha, 1) + time_offset
    time_scale: float = 0.999
    time_offset: float = 0.001
    # (t, ε) pairs drawn per observation in training: the observation is encoded once and the expert is trained on
    # all of them (the image encoders are ~3/4 of an update's time on the CPU, the expert a small MLP), so each
    # encoder pass carries more of the velocity field's signal. vla_bc's 4 tasks, 1,500 updates, 40 validation
    # episodes each (reach / lift / push / pick): K = 1 0.05 / 0.00 / 0.12 / 0.00, K = 4 0.05 / 0.55 / 0.30 / 0.20
    # (+6-18 % time per update), K = 16 0.12 / 0.50 / 0.22 / 0.12 (+30 %) (vla_bc.json, "flow_samples").
    flow_samples: int = 4
    # RECAP conditioning on CONDITION_KEY, classifier-free guidance at sampling.
    conditioning: bool = False  # the expert reads the advantage indicator
    cond_dropout: float = 0.3  # probability a training sample's indicator is replaced by "no condition"
    guidance_beta: float = 1.0  # β of v = v_u + β (v_c − v_u); 1: the conditional velocity alone
    # Sampling noise of act(deterministic=True): one fixed ε* ~ N(0, I) [H, A] drawn from this seed, the same for
    # every env and call. Not ε = 0: x_1 = 0 lies far from the noise the expert was trained on (|ε| ≈ sqrt(H·A)); on
    # the grounding task above it doubled the final-step error of random-noise samples.
    noise_seed: int = 0
    # Chunks sampled per observation at run time, their mean the action (an estimate of the conditional mean chunk,
    # where one sample carries the sampler's spread): from K fixed draws ε*_1..K of ``noise_seed`` (the first is the
    # ε* of K = 1) or K fresh ones. The expert runs on the K copies in one batch; the encoders run once. On vla_bc's
    # seed-0 policy of 2026-12-04 (validation seeds, 100 episodes per task, 3 executed steps), K = 1 / 8 / 16:
    # lift 0.80 / 0.98 / 0.96, push 0.57 / 0.71 / 0.84, pick 0.83 / 0.96 / 0.87; reach (200 episodes, 1 executed
    # step) 0.885 / - / 0.925; on its evaluation seeds reach / lift / push / pick 0.88 / 0.90 / 0.97 / 0.78 with one
    # sample, 0.92 / 0.97 / 0.99 / 0.86 with 16; on three seeds' weights 0.83 / 0.92 / 0.93 / 0.83 vs 0.91 / 0.98 /
    # 0.94 / 0.85 (vla_bc.json, "mean_of_samples_2026_12_04"; between separately trained policies a training run's
    # swing is as large). Policies saved before the option load with 1 (``ABSENT_KEY_DEFAULTS``), as they were
    # evaluated.
    mean_of_samples: int = 16
    # How the ``mean_of_samples`` chunks become one (``flow.reduce_samples``): "mean", "median" or "medoid". The
    # mean: on a seed-0 training (200 episodes, 2 executed steps) reach 0.97 / 0.965 / 0.965 and pick 0.78 / 0.68 /
    # 0.535 (mean / median / medoid); the medoid's single chunk misses the approach as one sample does
    # (vla_bc.json, "sample_reduction_trial_2026_12_04").
    sample_reduction: str = "mean"
    # Action features (the processor's action names, e.g. LeRobot's "wrist_roll.pos", "gripper.pos") whose value
    # is the per-coordinate median of the sampled chunks instead of ``sample_reduction``'s: for dimensions whose
    # samples split between modes, where the mean lies between them (``flow.reduce_samples``). Empty: none. On the
    # SO-101's wrist roll and gripper (a square cube is grasped across either pair of faces; the gripper closes at one
    # step or the next) it was within the noise either way: pick 0.791 -> 0.825 over 800 one-off episodes on two
    # trainings' weights, but 0.94 -> 0.90 on a third's 100 evaluation episodes, same execution (vla_bc.json,
    # "median_actions_trial_2026_12_05"). Off by default.
    median_actions: list[str] = field(default_factory=list)
    action_std_min: float = 1e-2  # degrees: floor of the action std used for normalisation (constant joints)
    # degrees: floor of the state std the input is normalised by. A joint that hardly moves in the demos (so101_reach's
    # scripted gripper: std 0.004 deg over 10 episodes) would otherwise turn a real arm's one-tick jitter (0.088 deg
    # on an STS3215) into 22 std, clipped at 10: an input the policy never saw. At 1 deg that tick is 0.09 std; joints
    # that move (10-60 deg std in every task's demos) are untouched.
    state_std_min: float = 1.0
    # Predict each chunk relative to the joints at its first frame (a_h - q, normalised per chunk step h by the
    # dataset's statistics of that difference) instead of as absolute targets; the policy's input and output stay
    # absolute targets in degrees (LeRobot's action), only the expert's space changes. Needs state and action to be
    # the same joints in the same order (checked against their names when known). Off by default: the one benchmark
    # pass with it on (together with a raised front camera, so not isolated) was worse (vla_bc.json, "history" ->
    # "pass3_relative_actions_raised_camera").
    relative_actions: bool = False

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("cameras: at least one camera is needed")
        if len(self.image_size) != 2 or min(self.image_size) < 8:
            raise ValueError(f"image_size must be [H, W] with both >= 8, got {self.image_size}")
        if self.horizon < 1 or not 1 <= self.executed_steps <= self.horizon:
            raise ValueError(f"need 1 <= executed_steps ({self.executed_steps}) <= horizon ({self.horizon})")
        bad_steps = {t: k for t, k in self.executed_steps_by_task.items() if not isinstance(t, str)
                     or isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.horizon}
        if bad_steps:
            raise ValueError(f"executed_steps_by_task: instruction -> an int in [1, horizon {self.horizon}], got "
                             f"{bad_steps}")
        bad_te = {t: m for t, m in [(None, self.temporal_ensemble), *self.temporal_ensemble_by_task.items()]
                  if m is not None and (isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m))}
        if bad_te or not all(isinstance(t, str) for t in self.temporal_ensemble_by_task):
            raise ValueError(f"temporal_ensemble (and temporal_ensemble_by_task's values, by instruction) must be a "
                             f"finite number or None, got {bad_te or self.temporal_ensemble_by_task}")
        if len(self.conv_channels) != len(self.conv_strides) or not self.conv_channels:
            raise ValueError(f"conv_channels {self.conv_channels} and conv_strides {self.conv_strides} must have the "
                             f"same, non-zero length")
        if self.relative_actions and self.state_dim != self.action_dim:
            raise ValueError(f"relative_actions needs state_dim == action_dim (the same joints), got {self.state_dim} "
                             f"and {self.action_dim}")
        if not (self.state_std_min > 0 and self.action_std_min > 0):
            raise ValueError(f"state_std_min and action_std_min must be > 0 degrees, got {self.state_std_min}, "
                             f"{self.action_std_min}")
        if self.state_noise < 0 or not 0 <= self.color_jitter < 1:
            raise ValueError(f"need state_noise >= 0 and 0 <= color_jitter < 1, got {self.state_noise}, "
                             f"{self.color_jitter}")
        if self.time_dim % 2:
            raise ValueError(f"time_dim must be even, got {self.time_dim}")
        if not 0.0 <= self.cond_dropout < 1.0:
            raise ValueError(f"cond_dropout must be in [0, 1), got {self.cond_dropout}")
        if min(self.num_steps, self.max_words, self.flow_samples, self.mean_of_samples) < 1:
            raise ValueError(f"num_steps, max_words, flow_samples and mean_of_samples must be >= 1, got "
                             f"{self.num_steps}, {self.max_words}, {self.flow_samples}, {self.mean_of_samples}")
        if self.sample_reduction not in SAMPLE_REDUCTIONS:
            raise ValueError(f"sample_reduction must be one of {SAMPLE_REDUCTIONS}, got {self.sample_reduction!r}")
        bad = [w for w in self.vocab if w in (PAD_TOKEN, UNK_TOKEN) or w != w.lower() or not w]
        if bad or len(set(self.vocab)) != len(self.vocab):
            raise ValueError(f"vocab must hold distinct lower-case words other than {PAD_TOKEN}/{UNK_TOKEN}; "
                             f"bad: {bad[:5]}")


def task_key(task: str) -> str:
    """The form an instruction is matched in ``executed_steps_by_task``: lower case, words single-spaced, no
    final full stop ("Pick up the red cube." and "pick up the red cube" are one task)."""
    return " ".join(task.lower().split()).rstrip(".")
