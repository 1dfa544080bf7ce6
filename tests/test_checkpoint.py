"""Checkpoints: safetensors + JSON round trip, atomicity, keep-last-K + best, pickle refusal, resume guard."""

import json
import math
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from robot_rl import checkpoint as ck
from robot_rl.checkpoint import (
    CheckpointManager,
    CorruptCheckpointError,
    ResumeMismatchError,
    UnsafeCheckpointError,
    check_resume_compatible,
    flatten_tree,
    load_checkpoint,
    unflatten_tree,
)


def _adam_state() -> dict:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(5, 3)).square().sum().backward()
        opt.step()
    return {"net": net.state_dict(), "opt": opt.state_dict()}


def _assert_tree_equal(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), path
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b), path
        for k in a:
            _assert_tree_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_tree_equal(x, y, f"{path}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b and type(a) is type(b), path


def test_tree_round_trip_optimizer_rng_and_odd_leaves():
    tree = {**_adam_state(), "rng": ck.rng_state(), "misc": {"nan": float("nan"), "inf": -math.inf, "none": None,
                                                              "tuple": (1, "a", 2.5), 7: True,
                                                              "u8": torch.arange(5, dtype=torch.uint8),
                                                              "f64": np.linspace(0, 1, 3)}}
    tensors, skeleton = flatten_tree(tree)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    json.dumps(skeleton)  # the skeleton is plain JSON
    _assert_tree_equal(tree, unflatten_tree(json.loads(json.dumps(skeleton)), tensors))


def test_rng_state_restores_python_numpy_torch():
    state = ck.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    tensors, skel = flatten_tree(state)
    ck.set_rng_state(unflatten_tree(json.loads(json.dumps(skel)), tensors))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_write_load_verify(tmp_path):
    from policies import GaussianPolicy, GaussianPolicyConfig

    pol = GaussianPolicy(GaussianPolicyConfig(obs_dim=3, action_dim=2, hidden_dims=[4]))
    state = _adam_state()
    mgr = CheckpointManager(tmp_path / "checkpoints")
    path = mgr.save(1, state, {"task": "t"}, policy=pol, score=1.0)
    manifest = json.loads((path / ck.MANIFEST).read_text())
    assert set(manifest["files"]) == {"state.safetensors", "state.json", "meta.json", "policy/config.json",
                                      "policy/model.safetensors", "policy/processor.json",
                                      "policy/processor.safetensors"}
    for target in (tmp_path, tmp_path / "checkpoints", path, path / ck.META):  # run dir, folder, checkpoint, file
        loaded = load_checkpoint(target)
        assert loaded.path == path and loaded.meta["iteration"] == 1 and loaded.meta["task"] == "t"
        _assert_tree_equal(state, loaded.state)
    # A flipped byte is caught by the manifest.
    raw = bytearray((path / ck.STATE_TENSORS).read_bytes())
    raw[-1] ^= 0xFF
    (path / ck.STATE_TENSORS).write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        load_checkpoint(path)
    (path / ck.MANIFEST).unlink()
    with pytest.raises(CorruptCheckpointError, match="incomplete"):
        load_checkpoint(path)


def test_keep_last_k_and_best(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for it, score in enumerate([1.0, 5.0, 2.0, 3.0, 0.0], start=1):
        mgr.save(it, {"x": torch.tensor([it])}, {}, score=score)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_00000002", "iter_00000004", "iter_00000005"]
    assert mgr.latest().name == "iter_00000005" and mgr.best().name == "iter_00000002"
    assert load_checkpoint(tmp_path / "best").meta["iteration"] == 2
    # A new manager (a resumed run) knows the best score and cleans orphans of a killed writer.
    (tmp_path / ".tmp-iter_00000006-dead").mkdir()
    (tmp_path / ".tmp-latest-dead").write_text("x")
    mgr2 = CheckpointManager(tmp_path, keep_last=2)
    assert mgr2.best_score == 5.0 and not list(tmp_path.glob(".tmp-*"))


def test_crash_during_write_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    """Simulated kills at every write of a checkpoint: the loader always finds a complete one (B2)."""
    real_write = ck._write_bytes
    good = {"x": torch.arange(10.0)}
    CheckpointManager(tmp_path).save(1, good, {})
    for fail_at in range(5):  # the 5 writes of a save: tensors, tree, meta, manifest, the latest pointer
        calls = {"n": 0}

        def dying_write(path, data, fail_at=fail_at, calls=calls):
            calls["n"] += 1
            if calls["n"] > fail_at:
                real_write(path, data[: len(data) // 2])  # half a file, then the process "dies"
                raise KeyboardInterrupt
            real_write(path, data)

        monkeypatch.setattr(ck, "_write_bytes", dying_write)
        with pytest.raises(KeyboardInterrupt):
            CheckpointManager(tmp_path).save(2, {"x": torch.zeros(10)}, {})
        monkeypatch.setattr(ck, "_write_bytes", real_write)
        loaded = load_checkpoint(tmp_path)
        assert loaded.meta["iteration"] == 1 and torch.equal(loaded.state["x"], good["x"])
    CheckpointManager(tmp_path)  # cleans the orphans
    assert not list(tmp_path.glob(".tmp-*"))


class _Payload:
    """Unpickling this creates a marker file: the attack a checkpoint loader must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickles_are_refused_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(probe)))  # the payload is real: unpickling it does create a file
    assert probe.exists()

    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    for name in ("model.pt", "policy.pkl", "sb3.zip"):
        (bad_dir / name).write_bytes(payload)
        with pytest.raises(UnsafeCheckpointError):
            load_checkpoint(bad_dir / name)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(bad_dir)
    # A pickle smuggled into an otherwise valid checkpoint (even listed in its manifest) is refused too.
    path = CheckpointManager(tmp_path / "run" / "checkpoints").save(1, {"x": torch.ones(2)}, {})
    (path / "extra.pt").write_bytes(payload)
    manifest = json.loads((path / ck.MANIFEST).read_text())
    manifest["files"]["extra.pt"] = ck._sha256(path / "extra.pt")
    (path / ck.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UnsafeCheckpointError, match="extra.pt"):
        load_checkpoint(tmp_path / "run")
    assert not marker.exists()


def test_resume_refuses_a_different_task_observation_or_action_space():
    meta = {"task": "so101_reach", "algo": "ppo", "action_dim": 6,
            "obs_spec": {"policy": {"shape": [27], "dtype": "torch.float32"}}}
    check_resume_compatible(meta, dict(meta))
    for key, value in (("task", "so101_lift"), ("action_dim", 7), ("algo", "flashsac"),
                       ("obs_spec", {"policy": {"shape": [30], "dtype": "torch.float32"}})):
        with pytest.raises(ResumeMismatchError, match=key):
            check_resume_compatible(meta, {**meta, key: value})


def test_no_unsafe_deserialization_in_the_sources():
    """F2: no pickle/cloudpickle loads, no torch.load without weights_only=True, no unsafe yaml/numpy loads."""
    root = Path(__file__).resolve().parents[1]
    patterns = ["pickle.load(", "pickle.loads(", "weights_only=False", "allow_pickle=True", "trust_remote_code=True",
                "yaml.load(", "yaml.unsafe_load("]
    bad = []
    for pkg in ("robot_rl", "policies", "sim", "real"):
        for path in (root / pkg).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if any(p in code for p in patterns) or ("torch.load(" in code and "weights_only=True" not in code):
                    bad.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert not bad, "unsafe deserialization:\n" + "\n".join(bad)
    assert os.path.basename(__file__)  # (the test's own file is outside the scanned packages)


@pytest.mark.parametrize("name", ["", "  ", ".", "..", "../iter_00000001", "sub/iter", "sub\\iter", "iter_missing"])
def test_a_pointer_that_names_no_sibling_folder_is_refused(tmp_path, name):
    """``latest`` / ``best`` name a checkpoint folder beside them and nothing else (no path out of the folder)."""
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save(1, {"x": torch.tensor([1])}, {})
    (tmp_path / "sub" / "iter").mkdir(parents=True)  # a folder a path could reach
    (tmp_path / "latest").write_text(name)
    with pytest.raises(ck.CheckpointError, match="does not name a checkpoint folder beside it"):
        load_checkpoint(tmp_path / "latest")
    (tmp_path / "latest").write_text(" iter_00000001\n")  # surrounding whitespace is not part of the name
    assert load_checkpoint(tmp_path / "latest").meta["iteration"] == 1


def test_a_write_error_names_the_path_the_os_reason_and_where_to_continue(tmp_path):
    full = ck.OutputWriteError(tmp_path / "ckpt", OSError(28, "No space left on device"), "resume=runs/x")
    assert str(full) == f"could not write {tmp_path / 'ckpt'}: No space left on device [errno 28]; resume=runs/x"
    bare = ck.OutputWriteError(tmp_path / "curve.jsonl", OSError("the disk went away"))  # no errno, no strerror
    assert str(bare) == f"could not write {tmp_path / 'curve.jsonl'}: the disk went away"


def test_rewriting_an_iteration_replaces_it_whole(tmp_path):
    """A resumed run saving an iteration it had written before it was killed: the new state replaces the old
    folder, which leaves nothing behind; a file of a checkpoint resolves to its folder, ``policy_dir`` inside it."""
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.save(3, {"x": torch.tensor([1.0])}, {"run": "first"})
    mgr.save(3, {"x": torch.tensor([2.0]), "y": torch.tensor([0])}, {"run": "resumed"})
    ckpt = load_checkpoint(tmp_path / "iter_00000003" / ck.META)
    assert ckpt.path == tmp_path / "iter_00000003" and ckpt.meta["run"] == "resumed"
    assert torch.equal(ckpt.state["x"], torch.tensor([2.0])) and set(ckpt.state) == {"x", "y"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_00000003", "latest"]
    assert ckpt.policy_dir == tmp_path / "iter_00000003" / ck.POLICY_DIR


def test_a_tie_keeps_the_earlier_best(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1)
    for it, score in ((1, 2.0), (2, 2.0), (3, 1.0)):
        mgr.save(it, {"x": torch.tensor([it])}, {}, score=score)
    assert mgr.best().name == "iter_00000001"  # not displaced by an equal score
    mgr.save(4, {"x": torch.tensor([4])}, {}, score=2.5)
    assert mgr.best().name == "iter_00000004"


def test_a_folder_of_safe_files_but_no_checkpoint_is_not_found_not_unsafe(tmp_path):
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=f"no checkpoint in {tmp_path}"):
        load_checkpoint(tmp_path)
    # what a folder of runs holds (configs, curves, plots): not a checkpoint, said as such (not "unsafe")
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "curve.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        load_checkpoint(tmp_path)
    (tmp_path / "weights.pkl").write_bytes(b"")
    with pytest.raises(UnsafeCheckpointError, match=r"non-safetensors/JSON files \['weights\.pkl'\]"):
        load_checkpoint(tmp_path)
    # an exported policy folder: the checkpoint above it is named
    policy = tmp_path / "ckpt" / "policy"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text("{}")
    (policy / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is an exported policy folder, not a checkpoint: give its checkpoint"):
        load_checkpoint(policy)
