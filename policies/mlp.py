"""The plain MLP used by Gaussian actors and by critics in ``robot_rl`` (one builder, one activation table)."""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU,
                                           "gelu": nn.GELU}


def activation(name: str) -> type[nn.Module]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; allowed: {sorted(ACTIVATIONS)}") from None


INITS = ("default", "orthogonal")


class OutputLinear(nn.Linear):
    """The last layer, in float32 even under bf16 autocast: an action mean or a value in the hundreds keeps its
    precision, and a product this narrow (64 -> 6) is no faster in bf16 here (18 vs 8 us at batch 384, 2 threads)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return super().forward(x.float())
        return super().forward(x)


def mlp(in_dim: int, hidden_dims: list[int] | tuple[int, ...], out_dim: int, act: str = "elu",
        init: str = "default", output_gain: float = 1.0) -> nn.Sequential:
    """in_dim -> hidden_dims[0] -> ... -> out_dim, the activation between layers and none after the last.

    ``init="orthogonal"``: orthogonal weights with gain √2 on hidden layers and ``output_gain`` on the last, zero
    biases (the PPO initialisation of OpenAI baselines / SB3; a policy head at gain 0.01 starts with mean actions
    near zero, so early exploration is the action noise alone). ``"default"`` keeps torch's Linear init.
    """
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; allowed: {list(INITS)}")
    act_cls = activation(act)
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden_dims]
    for a, b in itertools.pairwise(dims):
        # ELU in place: its backward then reads the output, grad·(y + 1), which is exactly 0 once y rounds to -1
        # (x < -17), where the out-of-place ELU's reads the input, grad·exp(x), subnormal for x < -87. A trained
        # ELU network has units that far below 0: their subnormal gradients then went through the next layers'
        # matrix products, which run 100-200x slower on subnormal floats on the CPU (their OpenMP threads ignore
        # torch.set_flush_denormal). Same forward values; see benchmarks/results/subnormal.json.
        layers += [nn.Linear(a, b), act_cls(inplace=True) if act_cls is nn.ELU else act_cls()]
    layers.append(OutputLinear(dims[-1], out_dim))
    if init == "orthogonal":
        linears = [m for m in layers if isinstance(m, nn.Linear)]
        for i, lin in enumerate(linears):
            nn.init.orthogonal_(lin.weight, gain=output_gain if i == len(linears) - 1 else math.sqrt(2.0))
            nn.init.zeros_(lin.bias)
    return nn.Sequential(*layers)
