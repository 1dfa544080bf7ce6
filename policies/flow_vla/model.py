"""The VLA's network: observation encoders -> a context vector, and the action expert v_θ(x_t, t | context, c).

Shapes: images {camera: [B, 3, H, W] in [-1, 1]}, token ids [B, L], normalised state [B, P] -> context [B, D];
the expert maps a normalised noisy chunk x_t [B, H, A], times t [B] and condition ids [B] to a velocity [B, H, A].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from policies.flow_vla.config import FlowVLAConfig
from policies.flow_vla.encoders import ImageEncoder, TextEncoder
from policies.flow_vla.flow import time_embedding

# Condition ids of the expert's condition embedding: no condition (dropped / unconditional), indicator 0, 1.
COND_NONE, COND_NEGATIVE, COND_POSITIVE = 0, 1, 2


class _FiLMBlock(nn.Module):
    """h + W2·SiLU(W1·(LN(h)·(1 + γ) + β)): a residual MLP block modulated by [γ, β] = ``film(c)`` of the
    conditioning vector c (computed apart, so a sampler can compute it once per Euler step for all of them)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.film = nn.Linear(dim, 2 * dim)
        self.fc1, self.fc2 = nn.Linear(dim, dim), nn.Linear(dim, dim)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def forward(self, h: torch.Tensor, film: torch.Tensor) -> torch.Tensor:
        gamma, beta = film.chunk(2, dim=-1)
        return h + self.fc2(F.silu(self.fc1(self.norm(h) * (1 + gamma) + beta)))


class FlowVLAModel(nn.Module):
    """Encoders + action expert (no normalisation, no tokenisation: ``FlowVLAPolicy`` does those)."""

    def __init__(self, cfg: FlowVLAConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_dim
        fine = 1 if cfg.fine_keypoints and len(cfg.conv_channels) > 2 else None  # 2 convs: conv 1 is the last
        self.images = nn.ModuleDict({cam: ImageEncoder(cfg.conv_channels, cfg.conv_strides, cfg.image_feature_dim,
                                                       cfg.text_dim, fine) for cam in cfg.cameras})
        self.text = TextEncoder(len(cfg.vocab), cfg.max_words, cfg.text_dim)
        ctx_in = len(cfg.cameras) * cfg.image_feature_dim + cfg.text_dim + cfg.state_dim
        self.context = nn.Sequential(nn.Linear(ctx_in, d), nn.SiLU(), nn.Linear(d, d))
        self.time = nn.Sequential(nn.Linear(cfg.time_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.condition = nn.Embedding(3, d) if cfg.conditioning else None
        chunk = cfg.horizon * cfg.action_dim
        self.chunk_in = nn.Linear(chunk, d)
        self.blocks = nn.ModuleList(_FiLMBlock(d) for _ in range(cfg.num_blocks))
        self.out_norm = nn.LayerNorm(d)
        self.chunk_out = nn.Linear(d, chunk)
        nn.init.normal_(self.chunk_out.weight, std=1e-3)
        nn.init.zeros_(self.chunk_out.bias)

    def encode(self, images: dict[str, torch.Tensor], tokens: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Context [B, D] from images {camera: [B, 3, H, W] in [-1, 1]}, token ids [B, L], normalised state [B, P]."""
        task = self.text(tokens)
        feats = [self.images[cam](images[cam], task) for cam in self.cfg.cameras]
        return self.context(torch.cat([*feats, task, state], dim=-1))

    def modulation(self, context: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """Each block's FiLM parameters [num_blocks, B, 2D] from context [B, D], t [B] and ``cond`` [B] of COND_*
        ids (None: no condition; ignored when the config has no conditioning). They do not depend on x_t."""
        c = context + self.time(time_embedding(t, self.cfg.time_dim))
        if self.condition is not None:
            ids = torch.full_like(t, COND_NONE, dtype=torch.long) if cond is None else cond
            c = c + self.condition(ids)
        c = F.silu(c)
        return torch.stack([block.film(c) for block in self.blocks])

    def expert(self, context: torch.Tensor, x_t: torch.Tensor, films: torch.Tensor) -> torch.Tensor:
        """v_θ [B, H, A] at x_t [B, H, A] (normalised actions) given ``modulation``'s films [num_blocks, B, 2D]."""
        h = self.chunk_in(x_t.flatten(1)) + context
        for block, film in zip(self.blocks, films, strict=True):
            h = block(h, film)
        return self.chunk_out(self.out_norm(h)).reshape(x_t.shape)

    def velocity(self, context: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                 cond: torch.Tensor | None = None) -> torch.Tensor:
        """v_θ(x_t, t | context, cond) [B, H, A]."""
        return self.expert(context, x_t, self.modulation(context, t, cond))
