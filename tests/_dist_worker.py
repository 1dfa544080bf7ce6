"""One rank of tests/test_distributed.py's collective checks, started by torchrun (2 processes, gloo on the CPU).

Each check compares what the ranks compute together with what one process computes from the pooled data; a failed
check raises, so torchrun exits non-zero and prints which. Rank 0 prints ``ok <name>`` for each check passed.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from policies.normalizer import EmpiricalNormalizer
from robot_rl.algos.ppo import PPO
from robot_rl.distributed import RanksDivergedError, from_environment


def batch(rank: int, rows: int, cols: int, scale: float) -> torch.Tensor:
    """A rank's own data, the same on every call (each rank can rebuild the other's)."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(rows, cols, generator=g) * scale + rank


def check_gradients(group) -> None:
    torch.manual_seed(0)  # the same weights on both ranks
    model = torch.nn.Linear(3, 2)
    unused = torch.nn.Parameter(torch.ones(4))
    params = [*model.parameters(), unused]
    xs = [batch(r, 5, 3, 1.0) for r in range(2)]
    ys = [batch(r + 10, 5, 2, 2.0) for r in range(2)]
    loss = ((model(xs[group.rank]) - ys[group.rank]) ** 2).mean()
    loss.backward()
    extra = group.average_gradients(params, torch.stack([loss.detach(), torch.tensor(float(group.rank))]))
    # one process, the two minibatches pooled: the gradient of the mean loss over all ten rows
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(model.state_dict())
    pooled = ((ref(torch.cat(xs)) - torch.cat(ys)) ** 2).mean()
    pooled.backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(unused.grad, torch.zeros(4))  # no gradient on either rank: zeros, not None
    losses = [((ref(x) - y) ** 2).mean().item() for x, y in zip(xs, ys, strict=True)]
    torch.testing.assert_close(extra, torch.tensor([sum(losses) / 2, 0.5]), rtol=1e-6, atol=1e-6)


def check_normalizer(group) -> None:
    shared = EmpiricalNormalizer(3)
    shared.reduce = group.sum_
    alone = EmpiricalNormalizer(3)  # one process fed both ranks' finite rows
    for step in range(3):
        mine = [batch(r + 20 * step, 5 - 2 * r, 3, 3.0) for r in range(2)]
        mine[0][1, 2] = float("nan")  # a bad row on rank 0: left out, on every rank alike
        if step == 2:
            mine[1][:] = float("inf")  # nothing usable on rank 1 this time: it still takes part
        before = shared.mean.clone()
        shared.update(mine[group.rank])
        assert torch.equal(shared.mean, before)  # data-parallel: nothing changes until every rank syncs
        if step != 1:  # two batches merge at the last sync
            shared.sync()
        pooled = torch.cat(mine)
        alone.update(pooled[torch.isfinite(pooled).all(dim=1)])
    assert shared.count.item() == alone.count.item() == 5 + 3 + 5 + 3 + 5 - 3, shared.count.item()
    torch.testing.assert_close(shared.mean, alone.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared.var, alone.var, rtol=1e-5, atol=1e-6)


def check_advantages(group) -> None:
    advs = [batch(r + 40, 4, 3, 2.0) for r in range(2)]
    valid = [torch.ones(4, 3, dtype=torch.bool), torch.ones(4, 3, dtype=torch.bool)]
    valid[1][2, 0] = False  # a faulted step on rank 1: outside the statistics, advantage 0
    buf = SimpleNamespace(advantages=advs[group.rank].clone(), valid=valid[group.rank],
                          has_invalid=lambda: not bool(valid[group.rank].all()))
    PPO._normalize_advantages_over_ranks(SimpleNamespace(group=group), buf)
    ok = torch.cat([a[v] for a, v in zip(advs, valid, strict=True)])
    want = torch.where(valid[group.rank], (advs[group.rank] - ok.mean()) / (ok.std() + 1e-8), 0.0)
    torch.testing.assert_close(buf.advantages, want, rtol=1e-5, atol=1e-6)


def check_same_and_broadcast(group) -> None:
    a = torch.arange(6, dtype=torch.float32) + 10 * group.rank
    b = torch.tensor([group.rank + 1, 7])
    group.broadcast_([a, b])
    assert torch.equal(a, torch.arange(6, dtype=torch.float32)) and torch.equal(b, torch.tensor([1, 7]))
    group.check_same([a, b], "tensors")  # the same everywhere: passes
    if group.rank == 1:
        a[3] = torch.nextafter(a[3], torch.tensor(100.0))  # one ulp apart
    try:
        group.check_same([a, b], "tensors")
    except RanksDivergedError:
        pass
    else:
        raise AssertionError("check_same missed a one-ulp difference between the ranks")
    tree = {"rank": group.rank, "t": torch.arange(3 + group.rank), "pair": (1.5, float("inf")), "none": None}
    got = group.gather_trees(tree)
    if group.main:
        assert [g["rank"] for g in got] == [0, 1] and torch.equal(got[1]["t"], torch.arange(4)), got
        assert got[1]["pair"] == (1.5, float("inf")) and got[1]["none"] is None
    else:
        assert got is None
    assert group.broadcast_text(f"runs/ü-{group.rank}") == "runs/ü-0"


CHECKS = {"gradients": check_gradients, "normalizer": check_normalizer, "advantages": check_advantages,
          "same_and_broadcast": check_same_and_broadcast}

if __name__ == "__main__":
    group = from_environment()
    assert group is not None and group.world_size == 2, "run me with torchrun --nproc-per-node 2"
    try:
        for name in sys.argv[1:] or list(CHECKS):
            CHECKS[name](group)
            if group.main:
                print(f"ok {name}", flush=True)
    finally:
        group.close()
