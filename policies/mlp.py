"""The plain MLP used by Gaussian actors and by critics in ``robot_rl`` (one builder, one activation table)."""

from __future__ import annotations

import itertools

from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU,
                                           "gelu": nn.GELU}


def activation(name: str) -> type[nn.Module]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; allowed: {sorted(ACTIVATIONS)}") from None


def mlp(in_dim: int, hidden_dims: list[int] | tuple[int, ...], out_dim: int, act: str = "elu") -> nn.Sequential:
    """in_dim -> hidden_dims[0] -> ... -> out_dim, the activation between layers and none after the last."""
    act_cls = activation(act)
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden_dims]
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), act_cls()]
    layers.append(nn.Linear(dims[-1], out_dim))
    return nn.Sequential(*layers)
