"""Image gathers for training batches, with DrQ's random-shift augmentation.

DrQ (Yarats et al., 2021): pad each image by ``pad`` pixels, replicating the border, and crop it back to its size
at a random offset, i.e. output pixel (i, j) = input pixel (clamp(i + dy, 0, H−1), clamp(j + dx, 0, W−1)) with
(dy, dx) ∈ [−pad, pad]² drawn per sample. The crop is one advanced-indexing read of an ``unfold`` view of the
padded batch (every possible crop, without copying), indexed on its leading dimensions so the result comes out
contiguous: 1.5-3 ms for 64 images of 3x64x64 on one core of a loaded 2-core machine, where a per-pixel
advanced-index gather took 20-40x longer and a Python loop of per-sample slices from a pre-padded cache ~20 % less
(for 27 % more cache memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shifts(batch_size: int, pad: int, generator: torch.Generator) -> torch.Tensor:
    """Integer shifts (dy, dx) ∈ [−pad, pad], int64 [B, 2], one per sample (shared by its history frames)."""
    return torch.randint(-pad, pad + 1, (batch_size, 2), generator=generator)


def gather_frames(cache: torch.Tensor, rows: torch.Tensor, shifts: torch.Tensor | None = None,
                  pad: int = 0) -> torch.Tensor:
    """Frames ``cache[rows]`` as float32 in [0, 1], each sample shifted by its (dy, dx) with the border replicated.

    Args:
        cache: uint8 [N, C, H, W], every frame of one camera.
        rows: int64 [B, K], which frames (K frames of history per sample).
        shifts: int64 [B, 2] pixel shifts (dy, dx) with |dy|, |dx| <= pad, or None for none.
        pad: the largest shift allowed (pixels).

    Returns:
        float32 [B, K, C, H, W].
    """
    b, k = rows.shape
    _, c, h, w = cache.shape
    x = cache.index_select(0, rows.reshape(-1)).float()  # [B*K, C, H, W]
    if shifts is not None and pad > 0:
        if shifts.abs().max() > pad:
            raise ValueError(f"shifts must lie in [-{pad}, {pad}]")
        crops = F.pad(x, (pad, pad, pad, pad), mode="replicate").unfold(2, h, 1).unfold(3, w, 1)
        crops = crops.permute(0, 2, 3, 1, 4, 5)  # [B*K, 2p+1, 2p+1, C, H, W], a view
        off = (shifts + pad).repeat_interleave(k, dim=0)  # [B*K, 2]
        x = crops[torch.arange(b * k), off[:, 0], off[:, 1]]
    return x.div_(255.0).view(b, k, c, h, w)
