"""Data-parallel training over processes (DESIGN.md §7): one learner per process, each with its own env batch, the
gradients averaged every step so every copy of the networks stays the same.

Launched by ``torchrun``, which sets each process's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous;
``torch.distributed`` does the communication (NCCL between GPUs, gloo on CPUs). Nothing here starts processes or
finds peers: that is torchrun's job.

    torchrun --standalone --nproc-per-node 2 -m robot_rl.cli.main train task=so101_reach sim.num_threads=1

What a rank does beyond a one-process run (``ProcessGroup``): rank 0's initial weights are copied to every rank;
each minibatch's gradients are averaged (one all-reduce of every gradient and the step's scalars together); running
observation statistics merge every rank's batch; episode statistics, the stopping rule and the run's clock are
rank 0's view of all ranks' episodes, so every rank stops at the same iteration; rank 0 alone writes the run folder,
and its checkpoints hold every rank's envs so a resume continues all of them. Nothing crosses between processes
pickled: tensors, and structures as a JSON skeleton with safetensors bytes (RELIABILITY.md E5).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # set by torchrun for each process it starts


class RanksDivergedError(RuntimeError):
    """The ranks' copies of the networks differ: their updates were not the same (a bug, not bad input)."""


class ProcessGroup:
    """This process's place in a data-parallel run and the collectives the learners need.

    Args:
        rank: this process's index in [0, world_size).
        world_size: processes in the run.
        local_rank: index among the processes on this machine (picks the GPU).
        device: where the collectives' tensors live (NCCL: this rank's GPU; gloo: the CPU).
    """

    def __init__(self, rank: int, world_size: int, local_rank: int = 0,
                 device: torch.device | str = "cpu") -> None:
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"a process group needs world_size >= 2 and 0 <= rank < world_size, got rank {rank} of "
                             f"{world_size}")
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.device = torch.device(device)

    @property
    def main(self) -> bool:
        """Rank 0: the process that logs, writes checkpoints and evaluates."""
        return self.rank == 0

    # ------------------------------------------------------------------------------------------ collectives
    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` replaced in place by its sum over ranks (every rank must call this); returns it."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def average_gradients(self, params: Sequence[torch.nn.Parameter], extra: torch.Tensor,
                          buffers: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Every parameter's ``.grad`` replaced by its mean over ranks, and ``extra`` (a 1-D float tensor of the
        step's scalars: losses, KL) averaged with them in the same all-reduce; returns the averaged ``extra``.
        ``buffers``: float tensors averaged in place in the same all-reduce (BatchNorm's running statistics, which
        each rank's forward pass moved by its own batch); others (counters) are left alone.

        With equal minibatch sizes on every rank, the mean of the ranks' gradients is the gradient of the loss over
        the union of their minibatches (each loss is a mean over its samples). A parameter with no gradient (unused
        this step) counts as zeros on that rank.
        """
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        floats = [b for b in buffers if b.is_floating_point()]
        dtype = grads[0].dtype
        flat = torch.cat([*(g.reshape(-1) for g in grads), *(b.reshape(-1).to(dtype) for b in floats),
                          extra.reshape(-1).to(dtype)])
        self.sum_(flat).div_(self.world_size)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            if p.grad is None:
                p.grad = g
            p.grad.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        for b in floats:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()
        return flat[offset:].to(extra.dtype)

    def any_(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any (one all-reduce)."""
        return bool(self.sum_(torch.tensor([float(flag)], device=self.device)).item() > 0)

    def broadcast_(self, tensors: Iterable[torch.Tensor], src: int = 0) -> None:
        """Each tensor overwritten in place with rank ``src``'s (one flat broadcast per dtype)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, src=src)
            offset = 0
            with torch.no_grad():
                for t in group:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    def broadcast_text(self, text: str, src: int = 0) -> str:
        """Rank ``src``'s ``text`` on every rank (UTF-8 bytes in tensors: nothing is unpickled)."""
        data = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8) if self.rank == src else None
        size = torch.tensor([0 if data is None else len(data)], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=src)
        buf = data.to(self.device) if data is not None else torch.empty(int(size), dtype=torch.uint8,
                                                                            device=self.device)
        dist.broadcast(buf, src=src)
        return bytes(buf.cpu().numpy()).decode()

    def gather_trees(self, tree: Any) -> list[Any] | None:
        """Every rank's ``tree`` (anything a checkpoint holds: tensors, arrays, JSON scalars in dicts, lists and
        tuples) in rank order on rank 0, None elsewhere; every rank must call it. Sent as a JSON skeleton and
        safetensors bytes (``robot_rl.checkpoint.flatten_tree``), never pickled: a peer's bytes cannot run code
        (RELIABILITY.md E5)."""
        from safetensors.torch import load as load_tensors
        from safetensors.torch import save as save_tensors

        from robot_rl.checkpoint import flatten_tree, unflatten_tree

        tensors, skeleton = flatten_tree(tree)
        head = json.dumps(skeleton).encode()
        data = len(head).to_bytes(8, "little") + head + save_tensors(tensors)
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=self.device))
        longest = int(max(int(s) for s in sizes))
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[:len(data)] = mine
        bufs = [torch.empty_like(padded) for _ in range(self.world_size)] if self.main else None
        dist.gather(padded, bufs, dst=0)
        if not self.main:
            return None
        out = []
        for buf, size in zip(bufs, sizes, strict=True):
            raw = bytes(buf[:int(size)].cpu().numpy())
            n = int.from_bytes(raw[:8], "little")
            out.append(unflatten_tree(json.loads(raw[8:8 + n]), load_tensors(raw[8 + n:])))
        return out

    def check_same(self, tensors: Iterable[torch.Tensor], what: str) -> None:
        """Raise ``RanksDivergedError`` unless every rank holds bitwise the same ``tensors`` (compared by a float64
        checksum of their values and their squares: two numbers per rank, one all-reduce)."""
        flat = torch.cat([t.detach().double().reshape(-1).cpu() for t in tensors])
        mine = torch.stack([flat.sum(), (flat * flat.abs().add(1.0)).sum()]).to(self.device)
        lo, hi = mine.clone(), mine.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        lo.neg_()
        dist.all_reduce(lo, op=dist.ReduceOp.MAX)
        if not torch.equal(hi, -lo):
            raise RanksDivergedError(f"the ranks' {what} differ (checksums from {(-lo).tolist()} to {hi.tolist()}): "
                                     "their updates were not the same")

    def close(self) -> None:
        """Leave the group once every rank is done: a rank that tore its connections down while a peer still used
        them aborted the peer at exit (gloo; seen once in four 2-process runs without the barrier)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def check_world_size(was: int, now: int, path: object) -> None:
    """Refuse to resume a checkpoint written by ``was`` processes in a run of ``now``: each process had its own envs,
    and their states are in the checkpoint, one per rank.

    Raises:
        ValueError: naming the launch that resumes it.
    """
    if was != now:
        how = "without torchrun" if was == 1 else f"with torchrun --nproc-per-node {was}"
        raise ValueError(f"cannot resume from {path}: it was written by a run of {was} process(es), each with its own "
                         f"envs; this run has {now}. Resume it {how}.")


def from_environment(device: torch.device | str = "cpu") -> ProcessGroup | None:
    """The process group torchrun set up for this process, joined (gloo on CPUs, NCCL on CUDA); None when this
    process runs alone (no ``WORLD_SIZE``, or 1).

    Raises:
        ValueError: torchrun's variables are incomplete or not integers.
    """
    if int(os.environ.get("WORLD_SIZE", "1") or "1") <= 1:
        return None
    missing = [v for v in WORLD_VARS if v not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {missing} unset: start data-parallel runs with "
                         "torchrun (e.g. torchrun --standalone --nproc-per-node 2 -m robot_rl.cli.main train ...)")
    rank, world, local = (int(os.environ[v]) for v in WORLD_VARS)
    cuda = torch.device(device).type == "cuda"
    here = torch.device("cuda", local) if cuda else torch.device("cpu")  # each rank its own GPU
    if cuda:
        torch.cuda.set_device(here)  # NCCL's object collectives use the current device
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return ProcessGroup(rank, world, local, here)


def rank_device(device: torch.device | str, group: ProcessGroup | None) -> torch.device:
    """The device this rank computes (or simulates) on: where the run asked for CUDA, its own GPU
    (``cuda:LOCAL_RANK``, whatever index was given: every process reads the same command line)."""
    device = torch.device(device)
    if group is None or device.type != "cuda":
        return device
    return torch.device("cuda", group.local_rank)
