"""The Adam(W) the learners step: torch's fused kernel where the device has one. AdamW for the offline learners (BC /
AWR / RECAP's policy, the value model), Adam for PPO and FlashSAC.

On the CPU torch's default AdamW loops over the parameters one tensor at a time. For the flow VLA (103 tensors,
1.37 M parameters, 2 cores) a step took 7.2-9.9 ms that way, 6.0-7.8 ms with ``foreach`` and 1.6-2.2 ms fused
(50 steps each, alternated, one process): about 5 % of a 130 ms update. PPO's update on so101_reach (actor and critic
of 256-128-64, 20 minibatches of 384): 71.1 ms fused against 80.1 ms with ``foreach`` (medians of six alternated
rounds of five updates, 2026-12-06); fused rounds differently from the per-tensor loop (within 2e-7 after three
updates), ``foreach`` does not.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused Adam(W) kernels exist for float32 parameters


def adamw(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float,
          device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``params`` (all on ``device``), fused where ``device`` supports it."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay,
                             fused=True if torch.device(device).type in FUSED_DEVICES else None)


def adam(params: Iterable[torch.nn.Parameter], lr: float, device: torch.device) -> torch.optim.Adam:
    """Adam over ``params`` (all on ``device``), fused where ``device`` supports it, else ``foreach``."""
    fused = torch.device(device).type in FUSED_DEVICES
    return torch.optim.Adam(params, lr=lr, fused=True if fused else None, foreach=None if fused else True)
