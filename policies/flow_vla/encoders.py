"""The VLA's observation encoders, trained from scratch: a small CNN with spatial softmax per camera, and a word
embedding of the task text pooled by attention (order- and word-sensitive: "red" and "blue" at the same place in
otherwise equal instructions give different vectors)."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from policies.flow_vla.config import PAD_TOKEN, UNK_TOKEN

PAD_ID, UNK_ID = 0, 1
_WORD = re.compile(r"[a-z0-9]+")


def split_words(text: str) -> list[str]:
    """Lower-case words of an instruction (letters and digits; punctuation separates)."""
    return _WORD.findall(text.lower())


def build_vocab(tasks: list[str]) -> list[str]:
    """The sorted distinct words of the training task strings (what ``FlowVLAConfig.vocab`` holds)."""
    return sorted({w for task in tasks for w in split_words(task)})


def tokenize(texts: list[str], word_ids: dict[str, int], max_words: int) -> torch.Tensor:
    """Token ids [B, max_words] (int64): word ids from ``word_ids``, ``UNK_ID`` for words not in it, ``PAD_ID`` after
    the last word.

    Raises:
        ValueError: an instruction with no word, or with more than ``max_words`` words (named).
    """
    ids = torch.full((len(texts), max_words), PAD_ID, dtype=torch.long)
    for i, text in enumerate(texts):
        words = split_words(text)
        if not words or len(words) > max_words:
            raise ValueError(f"task {i} {text!r} has {len(words)} words; the policy reads 1 to {max_words}")
        ids[i, : len(words)] = torch.tensor([word_ids.get(w, UNK_ID) for w in words])
    return ids


def word_index(vocab: list[str]) -> dict[str, int]:
    """word -> id (ids 0 and 1 are <pad> and <unk>)."""
    return {w: i + 2 for i, w in enumerate(vocab)} | {PAD_TOKEN: PAD_ID, UNK_TOKEN: UNK_ID}


class TextEncoder(nn.Module):
    """Token ids [B, L] -> [B, dim]: word + learned position embeddings, one self-attention layer (pre-norm
    transformer layer over the non-pad tokens), then a learned query attending over them (4 heads), LayerNorm.

    The per-token layer makes the pooled vector depend on which word sits where: an attention pool of
    word + position vectors alone is a near-uniform sum at initialisation, the same for "red cube" and "cube red".
    """

    def __init__(self, vocab_size: int, max_words: int, dim: int) -> None:
        super().__init__()
        heads = 4 if dim % 4 == 0 else 1
        self.words = nn.Embedding(vocab_size + 2, dim, padding_idx=PAD_ID)
        self.positions = nn.Parameter(torch.randn(max_words, dim))
        self.layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True,
                                                norm_first=True)
        self.query = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD_ID
        tokens = self.layer(self.words(ids) + self.positions[: ids.shape[1]], src_key_padding_mask=pad)
        pooled, _ = self.attn(self.query.expand(len(ids), -1, -1), tokens, tokens, key_padding_mask=pad,
                              need_weights=False)
        return self.norm(pooled[:, 0])


class SpatialSoftmax(nn.Module):
    """Feature maps [B, C, h, w] -> expected (x, y) in [-1, 1] of each channel's softmax over positions, [B, 2C].

    Always in float32, also under bf16 autocast: bf16's 8-bit mantissa would put the keypoints ~1/256 of the image
    off, and where things are is what they carry."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        with torch.autocast(features.device.type, enabled=False):
            return self._keypoints(features.float())

    @staticmethod
    def _keypoints(features: torch.Tensor) -> torch.Tensor:
        b, c, h, w = features.shape
        attn = features.flatten(2).softmax(dim=-1)  # [B, C, h·w]
        ys = torch.linspace(-1.0, 1.0, h, device=features.device, dtype=features.dtype)
        xs = torch.linspace(-1.0, 1.0, w, device=features.device, dtype=features.dtype)
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        coords = torch.stack([grid_x.flatten(), grid_y.flatten()], dim=-1)  # [h·w, 2]
        return (attn @ coords).reshape(b, 2 * c)


class ImageEncoder(nn.Module):
    """Images [B, 3, H, W] scaled to [-1, 1] and a task vector [B, T] -> [B, out_dim].

    3x3 convs, each followed by FiLM from the task vector, y = ReLU(conv(x)·(1 + γ) + β) (zero-initialised, so it
    starts as a plain CNN; RT-1's way of letting "red" vs "blue" pick which features the keypoints follow), then a
    1x1 conv to keypoint maps, spatial softmax with a learned temperature, Linear, LayerNorm. No normalisation
    layers: on the CPU GroupNorm cost as much as the convs. ``fine_from`` = i also takes keypoints from the output
    of conv i (a finer map: 16x16 for conv 1 at 64x64), concatenated before the Linear.
    """

    def __init__(self, channels: list[int], strides: list[int], out_dim: int, task_dim: int,
                 fine_from: int | None = None) -> None:
        super().__init__()
        if fine_from is not None and not 0 <= fine_from < len(channels):
            raise ValueError(f"fine_from must index one of the {len(channels)} convs, got {fine_from}")
        self.fine_from = fine_from
        c_in = 3
        self.convs, self.films = nn.ModuleList(), nn.ModuleList()
        for c_out, stride in zip(channels, strides, strict=True):
            self.convs.append(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1))
            self.films.append(nn.Linear(task_dim, 2 * c_out))
            nn.init.zeros_(self.films[-1].weight)
            nn.init.zeros_(self.films[-1].bias)
            c_in = c_out
        self.keypoint_maps = nn.Conv2d(c_in, c_in, 1)
        fine = 0 if fine_from is None else channels[fine_from]
        self.fine_maps = nn.Conv2d(fine, fine, 1) if fine else None
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.keypoints = SpatialSoftmax()
        self.proj = nn.Sequential(nn.Linear(2 * (c_in + fine), out_dim), nn.LayerNorm(out_dim))

    def forward(self, images: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        # NHWC: the layout oneDNN's CPU convolutions run fastest in. A BC update of the flow VLA on vla_bc's data (2
        # cores, quiet, alternated with NCHW): 139-152 vs 168-176 ms in float32, 128-132 vs 142-148 ms under bf16.
        h, points = images.contiguous(memory_format=torch.channels_last), []
        temperature = self.log_temperature.exp()
        for i, (conv, film) in enumerate(zip(self.convs, self.films, strict=True)):
            gamma, beta = film(task)[:, :, None, None].chunk(2, dim=1)
            h = torch.relu_(torch.addcmul(beta, conv(h), 1.0 + gamma))
            if i == self.fine_from:
                points.append(self.keypoints(self.fine_maps(h) / temperature))
        return self.proj(torch.cat([self.keypoints(self.keypoint_maps(h) / temperature), *points], dim=-1))


def to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] (sim, robot) or float [0, 1] (datasets) images -> float32 in [-1, 1]."""
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    return x * 2.0 - 1.0


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """DrQ's augmentation: each image [B, C, H, W] translated by an integer shift in [-pad, pad] pixels on each
    axis, borders replicated."""
    if pad <= 0:
        return images
    b, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    shift = torch.randint(0, 2 * pad + 1, (b, 2), generator=generator, device=images.device)
    rows = torch.arange(h, device=images.device)[None, :] + shift[:, 1:2]  # [B, H]
    cols = torch.arange(w, device=images.device)[None, :] + shift[:, 0:1]  # [B, W]
    idx = torch.arange(b, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def color_jitter(images: torch.Tensor, strength: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Photometric augmentation of images [B, 3, H, W] in [-1, 1], drawn per image, geometry untouched:

        y = clip(g ⊙ (m + c·(s·(b·x − l) + l − m)), 0, 1) on x in [0, 1], back to [-1, 1],

    with brightness b, saturation s and contrast c each ~ U[1 − strength, 1 + strength], per-channel gains
    g ~ U[1 − strength/2, 1 + strength/2], l the pixel's luminance (0.299 R + 0.587 G + 0.114 B) of b·x and m the
    image's mean luminance of that. The kind of change lighting and surface colours make (what the simulator's
    visual randomization varies, and a real camera's exposure and white balance), applied afresh to every training
    sample so the encoder sees many looks of each demonstration frame. ``strength`` 0: the images as they are."""
    if strength <= 0:
        return images
    b = images.shape[0]

    def u(half_width: float, channels: int = 1) -> torch.Tensor:  # U[1 - half_width, 1 + half_width], [B, C, 1, 1]
        r = torch.rand(b, channels, 1, 1, generator=generator, device=images.device)
        return 1.0 + half_width * (2.0 * r - 1.0)

    x = (images + 1.0) * 0.5 * u(strength)  # brightness
    weights = torch.tensor([0.299, 0.587, 0.114], device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    lum = (x * weights).sum(dim=1, keepdim=True)  # [B, 1, H, W]
    x = lum + u(strength) * (x - lum)  # saturation
    mean = lum.mean(dim=(2, 3), keepdim=True)
    x = mean + u(strength) * (x - mean)  # contrast
    return (x * u(0.5 * strength, 3)).clamp(0.0, 1.0) * 2.0 - 1.0  # per-channel gains
