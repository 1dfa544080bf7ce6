"""A distributional, language-conditioned value model over LeRobot frames (images + state + instruction).

It estimates V(o_t) = -(steps remaining to success) / M for the task's max episode length M (failed episodes: -1,
``robot_rl.data.labels``) as a categorical distribution over ``num_bins`` evenly spaced values on
[v_min, v_max] = [-1, 0] (201 bins: one every 0.005), trained by cross-entropy against a target distribution
built from the scalar target y:

- HL-Gauss (Imani & White 2018; Farebrother et al. 2024): the mass of N(y, σ²) falling in each bin,
  p_i = Φ((e_{i+1} − y)/σ) − Φ((e_i − y)/σ), renormalised over the support, σ = ``sigma_ratio`` · bin width;
- two-hot: y split between its two neighbouring bin centres in proportion to its distance to each.

The prediction is the distribution's mean, V = Σ_i softmax(logits)_i · c_i. The encoders follow the flow VLA's
design (``policies.flow_vla.encoders``: a small CNN + spatial softmax per camera, FiLM-modulated by the instruction
vector; a word-embedding text encoder pooled by attention), with their own weights. The value model belongs to
the learner (RECAP, the improvement loop), never to an exported policy.

Frames (``policies.keys``): ``observation.state`` float [B, P] (degrees), ``observation.images.<camera>`` uint8
[B, 3, H, W] (sim) or float [0, 1] (datasets), ``task`` list[str] of B; with ``state_lags`` also
``observation.state_lags`` float [B, L, P], the joints L lags earlier (``ChunkSampler.state_lags`` from a dataset,
``StateLags`` live).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies import keys
from policies.flow_vla.encoders import (
    ImageEncoder,
    TextEncoder,
    build_vocab,
    random_shift,
    split_words,
    to_unit_range,
    tokenize,
    word_index,
)

HL_GAUSS, TWO_HOT = "hl_gauss", "two_hot"


@dataclass
class ValueConfig:
    """Architecture, support and loss of the value model. ``cameras``, ``image_size``, ``state_dim`` and ``vocab``
    are set from the dataset (``ValueModel.from_stats``)."""

    cameras: list[str] = field(default_factory=lambda: ["front", "wrist"])  # reads observation.images.<camera>
    image_size: list[int] = field(default_factory=lambda: [64, 64])  # [H, W] pixels
    state_dim: int = 6  # P, observation.state (degrees)
    vocab: list[str] = field(default_factory=list)  # task words (lower case)
    max_words: int = 16  # longest instruction, in words
    conv_channels: list[int] = field(default_factory=lambda: [32, 32, 64, 64])  # per 3x3 conv of each camera
    conv_strides: list[int] = field(default_factory=lambda: [2, 2, 2, 1])
    image_feature_dim: int = 128  # per-camera feature size
    text_dim: int = 64  # word embedding size
    hidden_dim: int = 256  # units of the two hidden layers of the head
    random_shift: int = 4  # pixels of DrQ random translation of the images in training mode (0: off)
    num_bins: int = 201  # K, atoms of the value distribution
    v_min: float = -1.0  # value of the first atom
    v_max: float = 0.0  # value of the last atom
    loss: str = HL_GAUSS  # "hl_gauss" or "two_hot"
    sigma_ratio: float = 0.75  # HL-Gauss σ in bin widths
    state_std_min: float = 1.0  # degrees: floor of the state std (a joint constant in the data; FlowVLAConfig's)
    # Frames back (each >= 1) of earlier joint readings it also reads (``keys.OBS_STATE_LAGS``, normalised as the
    # state): one frame's joint positions cannot tell an arm going down to the cube from one coming back up, or a
    # pause from a move. On recap.py's so101_lift data (value_ceiling.json -> state_lags_trial_2026_12_07) [5, 10]
    # lifted held-out VOC from 0.72 / 0.76 / 0.67 to 0.76 / 0.81 / 0.73 over three seeds (1,500 steps); a state-only
    # model from 0.62-0.66 to 0.78-0.80. Empty: the current frame only.
    state_lags: list[int] = field(default_factory=lambda: [5, 10])

    def __post_init__(self) -> None:
        if not self.cameras:
            raise ValueError("value cameras: at least one camera is needed")
        if self.num_bins < 2 or not self.v_min < self.v_max:
            raise ValueError(f"value num_bins must be >= 2 and v_min < v_max, got {self.num_bins}, "
                             f"[{self.v_min}, {self.v_max}]")
        if self.loss not in (HL_GAUSS, TWO_HOT):
            raise ValueError(f"value loss must be {HL_GAUSS!r} or {TWO_HOT!r}, got {self.loss!r}")
        if self.random_shift < 0:
            raise ValueError(f"value random_shift must be >= 0, got {self.random_shift}")
        if self.sigma_ratio <= 0:
            raise ValueError(f"value sigma_ratio must be > 0, got {self.sigma_ratio}")
        if not self.state_std_min > 0:
            raise ValueError(f"value state_std_min must be > 0 degrees, got {self.state_std_min}")
        if any(int(lag) < 1 for lag in self.state_lags) or len(set(self.state_lags)) != len(self.state_lags):
            raise ValueError(f"value state_lags must be distinct frames back, each >= 1, got {self.state_lags}")
        if len(self.conv_channels) != len(self.conv_strides) or not self.conv_channels:
            raise ValueError(f"value conv_channels {self.conv_channels} and conv_strides {self.conv_strides} must "
                             "have the same, non-zero length")


# ------------------------------------------------------------------------------------------- the math
def bin_centers(num_bins: int, v_min: float, v_max: float) -> torch.Tensor:
    """c_i = v_min + i·w, w = (v_max − v_min)/(K − 1), i = 0..K−1: [K] float32."""
    return torch.linspace(v_min, v_max, num_bins, dtype=torch.float32)


def two_hot(target: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """[B, K]: y (clipped to the support) split between its neighbouring centres c_l ≤ y ≤ c_{l+1},
    p_l = (c_{l+1} − y)/w, p_{l+1} = (y − c_l)/w; exactly one-hot on a centre."""
    k = len(centers)
    w = float(centers[1] - centers[0])
    pos = ((target.clamp(float(centers[0]), float(centers[-1])) - centers[0]) / w).clamp(0, k - 1)
    low = pos.floor().long().clamp(max=k - 2)
    up_w = pos - low
    out = torch.zeros(*target.shape, k, dtype=centers.dtype, device=target.device)
    out.scatter_(-1, low.unsqueeze(-1), (1.0 - up_w).unsqueeze(-1).to(out.dtype))
    out.scatter_add_(-1, (low + 1).unsqueeze(-1), up_w.unsqueeze(-1).to(out.dtype))
    return out


def hl_gauss(target: torch.Tensor, centers: torch.Tensor, sigma: float) -> torch.Tensor:
    """[B, K]: the mass of N(y, σ²) in each bin [c_i − w/2, c_i + w/2], renormalised over the support."""
    w = float(centers[1] - centers[0])
    edges = torch.cat([centers - w / 2, centers[-1:] + w / 2]).to(target.device)  # [K + 1]
    cdf = 0.5 * (1.0 + torch.erf((edges - target.unsqueeze(-1)) / (sigma * math.sqrt(2.0))))  # [B, K + 1]
    mass = cdf[..., 1:] - cdf[..., :-1]
    return mass / (cdf[..., -1:] - cdf[..., :1]).clamp_min(1e-12)


def expected_value(logits: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """V = Σ_i softmax(logits)_i · c_i: [B] from logits [B, K]."""
    return logits.softmax(-1) @ centers.to(logits)


# ------------------------------------------------------------------------------------------- the model
class ValueModel(nn.Module):
    """logits [B, K] of V(o) from a frame (see the module docstring).

    Args:
        cfg: architecture and support.
    """

    def __init__(self, cfg: ValueConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.images = nn.ModuleDict({cam: ImageEncoder(cfg.conv_channels, cfg.conv_strides, cfg.image_feature_dim,
                                                       cfg.text_dim) for cam in cfg.cameras})
        self.text = TextEncoder(len(cfg.vocab), cfg.max_words, cfg.text_dim)
        d_in = len(cfg.cameras) * cfg.image_feature_dim + cfg.text_dim + cfg.state_dim * (1 + len(cfg.state_lags))
        self.head = nn.Sequential(nn.Linear(d_in, cfg.hidden_dim), nn.LayerNorm(cfg.hidden_dim), nn.SiLU(),
                                  nn.Linear(cfg.hidden_dim, cfg.hidden_dim), nn.SiLU(),
                                  nn.Linear(cfg.hidden_dim, cfg.num_bins))
        self.register_buffer("centers", bin_centers(cfg.num_bins, cfg.v_min, cfg.v_max))
        self.register_buffer("state_mean", torch.zeros(cfg.state_dim))  # degrees
        self.register_buffer("state_std", torch.ones(cfg.state_dim))  # degrees
        self._word_ids = word_index(cfg.vocab)

    @classmethod
    def from_stats(cls, stats: Mapping[str, Mapping[str, Any]], tasks: list[str], cfg: ValueConfig) -> ValueModel:
        """A fresh model for a dataset: its task words as the vocabulary, its state statistics set."""
        cfg = dataclasses.replace(cfg, vocab=build_vocab(tasks))
        longest = max((len(split_words(t)) for t in tasks), default=0)
        if longest > cfg.max_words:
            raise ValueError(f"a task has {longest} words, more than value max_words={cfg.max_words}")
        model = cls(cfg)
        mean = torch.as_tensor(stats[keys.OBS_STATE]["mean"], dtype=torch.float32).reshape(-1)
        std = torch.as_tensor(stats[keys.OBS_STATE]["std"], dtype=torch.float32).reshape(-1)
        if mean.numel() != cfg.state_dim or std.numel() != cfg.state_dim:
            raise ValueError(f"state statistics have {mean.numel()} values, the value model reads {cfg.state_dim}")
        model.state_mean.copy_(mean)
        model.state_std.copy_(std.clamp_min(cfg.state_std_min))
        return model

    @property
    def device(self) -> torch.device:
        return self.centers.device

    def forward(self, frame: Mapping[str, Any]) -> torch.Tensor:
        """logits [B, K] of a frame (``observation.state``, the config's cameras, ``task``)."""
        return self.head(self._inputs(frame))

    @torch.no_grad()
    def value_and_features(self, frame: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """V(o) [B] and the head's last hidden layer [B, hidden_dim]: what the model sees of the frame, the key of
        the intervention agent's memory of states (``robot_rl.hil.memory``)."""
        feats = self.head[:-1](self._inputs(frame))
        return expected_value(self.head[-1](feats), self.centers), feats

    def _inputs(self, frame: Mapping[str, Any]) -> torch.Tensor:
        """The head's input [B, D]: image features, instruction, normalised joints (and their earlier readings)."""
        state = frame[keys.OBS_STATE].to(self.device).float()
        if state.dim() != 2 or state.shape[1] != self.cfg.state_dim:
            raise ValueError(f"{keys.OBS_STATE} has shape {list(state.shape)}, the value model reads "
                             f"[B, {self.cfg.state_dim}]")
        b = state.shape[0]
        tasks = frame[keys.TASK]
        tasks = [tasks] * b if isinstance(tasks, str) else list(tasks)
        if len(tasks) != b:
            raise ValueError(f"{keys.TASK!r} holds {len(tasks)} instructions for {b} frames")
        task = self.text(tokenize(tasks, self._word_ids, self.cfg.max_words).to(self.device))
        feats = []
        for cam in self.cfg.cameras:
            name = keys.lerobot_image_key(cam)
            if name not in frame:
                raise ValueError(f"the value model reads {name!r}; the frame has {sorted(frame)}")
            img = to_unit_range(frame[name].to(self.device))
            if self.training and self.cfg.random_shift > 0:  # a value hardly moves with a 4 px shift: no label noise
                img = random_shift(img, self.cfg.random_shift)
            feats.append(self.images[cam](img, task))
        parts = [(state - self.state_mean) / self.state_std]
        if self.cfg.state_lags:
            lags = len(self.cfg.state_lags)
            if keys.OBS_STATE_LAGS not in frame:
                raise ValueError(f"the value model reads {keys.OBS_STATE_LAGS!r} (the joints {self.cfg.state_lags} "
                                 f"frames back; state_lags); the frame has {sorted(frame)}")
            past = frame[keys.OBS_STATE_LAGS].to(self.device).float()
            if list(past.shape) != [b, lags, self.cfg.state_dim]:
                raise ValueError(f"{keys.OBS_STATE_LAGS} has shape {list(past.shape)}, the value model reads "
                                 f"[B, {lags}, {self.cfg.state_dim}] (B = {b})")
            parts.append(((past - self.state_mean) / self.state_std).flatten(1))
        return torch.cat([*feats, task, *parts], dim=-1)

    def target_distribution(self, target: torch.Tensor) -> torch.Tensor:
        """[B, K] target distribution of scalar targets [B] (the config's loss)."""
        if self.cfg.loss == TWO_HOT:
            return two_hot(target, self.centers)
        width = (self.cfg.v_max - self.cfg.v_min) / (self.cfg.num_bins - 1)
        return hl_gauss(target, self.centers, self.cfg.sigma_ratio * width)

    def loss(self, frame: Mapping[str, Any], target: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Cross-entropy between the predicted distribution and the target's; also the mean absolute error of the
        mean prediction (value units)."""
        logits = self(frame).float()  # float32 also under bf16 autocast: 201 bins of 0.005 need the precision
        target = target.to(self.device).float()
        ce = -(self.target_distribution(target) * F.log_softmax(logits, -1)).sum(-1).mean()
        mae = (expected_value(logits.detach(), self.centers) - target).abs().mean()
        return ce, {"loss/value_ce": float(ce.detach()), "value/mae": float(mae)}

    @torch.no_grad()
    def value(self, frame: Mapping[str, Any]) -> torch.Tensor:
        """V(o) [B] (value units, in [v_min, v_max])."""
        return expected_value(self(frame), self.centers)
