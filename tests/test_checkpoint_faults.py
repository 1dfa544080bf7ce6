"""Faults on the training side end in clean errors (RELIABILITY.md B3, F3; issue 17).

Malformed checkpoint files: a seeded fuzz of safetensors headers (random bytes, huge declared lengths, overlapping
offsets, bad dtypes, huge shapes, 100,000 zero-size tensors, truncation, ...), each written into a copy of a real
checkpoint with its manifest hash updated so that the parser itself is reached, through the resume path
(``load_checkpoint``) and the eval path (``load_meta`` + ``policies.load_policy``): each is one typed error in under
a second, and the command line turns it into one ``error:`` line with exit status 2.

A full disk: a run checkpointing every iteration on a filesystem with room for about one checkpoint stops with one
line naming the file, the error and the checkpoint to resume from, leaves no partial ``.tmp-*`` folder, cleans up a
stale one before writing anything when it resumes on the still-full disk, and once space is back continues to the
same final parameters as a run that never failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import resource
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import GaussianPolicy, GaussianPolicyConfig, keys, load_policy
from policies.persistence import PolicyFileError
from policies.safetensors_check import MAX_TENSORS, MalformedFileError, check_safetensors
from robot_rl import checkpoint as ck
from robot_rl.algos.ppo import PPO, PPOConfig
from robot_rl.checkpoint import (
    CheckpointError,
    CheckpointManager,
    OutputWriteError,
    flatten_tree,
    load_checkpoint,
    load_meta,
)
from robot_rl.cli.main import main
from robot_rl.logging import CURVE_FILE, LoggerConfig, RunLogger, plot_learning_curve, write_video
from robot_rl.models.critics import CriticConfig, MLPCritic
from robot_rl.runners.on_policy import OnPolicyRunner, OnPolicyRunnerConfig
from tests._toy_reach import PointReach2D

STATE = ck.STATE_TENSORS
POLICY = f"{ck.POLICY_DIR}/model.safetensors"


# ----------------------------------------------------------------------------------------- a real checkpoint
@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """One complete checkpoint: a Gaussian policy, its Adam state and RNG states, as a training run writes them."""
    torch.manual_seed(0)
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=6, action_dim=2, hidden_dims=[16, 16]))
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        sum((p - 1.0).square().sum() for p in policy.parameters()).backward()  # any loss: Adam gets moments
        opt.step()
    state = {"algo": {"policy": policy.state_dict(), "optimizer": opt.state_dict()}, "rng": ck.rng_state()}
    root = tmp_path_factory.mktemp("pristine") / "checkpoints"
    return CheckpointManager(root).save(1, state, {"task": "toy"}, policy=policy)


def _rehash(folder: Path) -> None:
    """Update the manifest to the files as they are now, so loading gets past the sha256 check to the parser."""
    manifest = json.loads((folder / ck.MANIFEST).read_text())
    for rel in manifest["files"]:
        manifest["files"][rel] = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    (folder / ck.MANIFEST).write_text(json.dumps(manifest))


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header: dict | list | bytes, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _entries(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


# ----------------------------------------------------------------------------------- the malformations
# Each takes (rng, the original file's bytes) and returns the bad file. All keep to the target's own tensors, so the
# error a case raises is about the file, never about the fixture.
def _random_bytes(rng: random.Random, data: bytes) -> bytes:
    return rng.randbytes(rng.randint(0, 4096))


def _random_after_length(rng: random.Random, data: bytes) -> bytes:
    return data[:8] + rng.randbytes(len(data) - 8)


def _huge_header_length(rng: random.Random, data: bytes) -> bytes:
    return struct.pack("<Q", rng.choice([2**64 - 1, 2**63, 10**12, rng.randint(len(data), 2**64 - 1)])) + data[8:]


def _header_past_the_end(rng: random.Random, data: bytes) -> bytes:
    return struct.pack("<Q", len(data) - 8 + rng.randint(1, 1000)) + data[8:]


def _truncated(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randint(0, len(data) - 1)]


def _header_not_json(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header.pop("__metadata__", None)  # a byte changed in its free text could leave a valid file
    raw = json.dumps(header).encode()
    pos = rng.randrange(len(raw))
    bad = rng.choice([b for b in (b"\xff\xfe", b"{", b"]", b'"', b"\x00", b",,") if b != raw[pos:pos + 1]])
    return _join(raw[:pos] + bad + raw[pos + 1:], body)


def _header_not_an_object(rng: random.Random, data: bytes) -> bytes:
    _, body = _split(data)
    return _join(rng.choice([b"[]", b"42", b'"x"', b"null", b"[" * 50_000 + b"]" * 50_000, b"[" * 200_000]), body)


def _bad_dtype(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header[rng.choice(_entries(header))]["dtype"] = rng.choice(["F31", "float32", "", "Q8", 5, None, "f32", [1]])
    return _join(header, body)


def _overlapping_offsets(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    names = [k for k in _entries(header) if header[k]["data_offsets"][1] > header[k]["data_offsets"][0]]
    a, b = rng.sample(names, 2)
    header[b]["data_offsets"] = list(header[a]["data_offsets"])  # same span twice
    header[b]["shape"], header[b]["dtype"] = header[a]["shape"], header[a]["dtype"]
    return _join(header, body)


def _shifted_offsets(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    name = rng.choice([k for k in _entries(header)[1:] if header[k]["data_offsets"][0] > 0])
    k = rng.randint(1, header[name]["data_offsets"][0])
    header[name]["data_offsets"] = [o - k for o in header[name]["data_offsets"]]  # overlaps the one before
    return _join(header, body)


def _huge_shape(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    e = header[rng.choice(_entries(header))]
    e["shape"] = rng.choice([[2**62, 2**62], [2**31] * 8, [10**9, 10**9, 10**9], [1] * 100_000, [2**64 + 1]])
    return _join(header, body)


def _bad_shape_values(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header[rng.choice(_entries(header))]["shape"] = rng.choice([[-1, 3], [1.5], ["3"], [True], 7, None, [[2]]])
    return _join(header, body)


def _shape_span_mismatch(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    e = header[rng.choice(_entries(header))]
    e["shape"] = [*e["shape"], rng.randint(2, 9)]
    return _join(header, body)


def _offsets_outside(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    e = header[rng.choice(_entries(header))]
    e["data_offsets"] = rng.choice([[0, len(body) + 4], [len(body) + 8, len(body) + 12], [-4, 0],
                                    [e["data_offsets"][1], e["data_offsets"][0] - 1], [0], "0,4", [0.0, 4.0]])
    return _join(header, body)


def _hole(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    names = [k for k in _entries(header) if header[k]["data_offsets"][1] > header[k]["data_offsets"][0]]
    del header[rng.choice(names)]  # its bytes are left unindexed
    return _join(header, body)


def _entry_keys(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    e = header[rng.choice(_entries(header))]
    if rng.random() < 0.5:
        del e[rng.choice(["dtype", "shape", "data_offsets"])]
    else:
        e["extra"] = 1
    return _join(header, body)


def _bad_metadata(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header["__metadata__"] = rng.choice([{"a": 1}, [1], "x", {"a": None}])
    return _join(header, body)


def _many_zero_size_tensors(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header.update({f"z{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(100_000)})
    return _join(header, body)


def _renamed_tensor(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    name = rng.choice(_entries(header))
    header[name + ".renamed"] = header.pop(name)
    return _join(header, body)


def _extra_tensor(rng: random.Random, data: bytes) -> bytes:
    header, body = _split(data)
    header["extra.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(body), len(body) + 4]}
    return _join(header, body + b"\x00" * 4)


def _same_size_dtype(rng: random.Random, data: bytes) -> bytes:
    """A valid file whose float tensor became int32: only a loader that knows the policy can refuse it."""
    header, body = _split(data)
    header[rng.choice([k for k in _entries(header) if header[k]["dtype"] == "F32"])]["dtype"] = "I32"
    return _join(header, body)


def _reshaped(rng: random.Random, data: bytes) -> bytes:
    """A valid file whose matrix became flat: only a loader that knows the policy can refuse it."""
    header, body = _split(data)
    e = header[rng.choice([k for k in _entries(header) if len(header[k]["shape"]) == 2])]
    e["shape"] = [e["shape"][0] * e["shape"][1]]
    return _join(header, body)


Mutation = Callable[[random.Random, bytes], bytes]
ANY_FILE: list[Mutation] = [
    _random_bytes, _random_after_length, _huge_header_length, _header_past_the_end, _truncated, _header_not_json,
    _header_not_an_object, _bad_dtype, _overlapping_offsets, _shifted_offsets, _huge_shape, _bad_shape_values,
    _shape_span_mismatch, _offsets_outside, _hole, _entry_keys, _bad_metadata, _renamed_tensor, _extra_tensor]
POLICY_ONLY: list[Mutation] = [_same_size_dtype, _reshaped]  # a state tree's dtypes and shapes are free


@dataclass(frozen=True)
class Case:
    index: int
    target: str  # the file corrupted, relative to the checkpoint folder
    mutation: Mutation

    def __str__(self) -> str:
        return f"{self.index:03d}-{self.mutation.__name__.lstrip('_')}-{'state' if self.target == STATE else 'policy'}"


def _cases(n: int = 240) -> list[Case]:
    cases = []
    for i in range(n):
        muts = ANY_FILE + POLICY_ONLY
        m = muts[i % len(muts)]
        target = POLICY if m in POLICY_ONLY or (i // len(muts)) % 2 else STATE
        cases.append(Case(i, target, m))
    cases += [Case(n, STATE, _many_zero_size_tensors), Case(n + 1, POLICY, _many_zero_size_tensors)]
    return cases


CASES = _cases()


def _make(pristine: Path, tmp_path: Path, case: Case) -> Path:
    folder = tmp_path / pristine.name
    shutil.copytree(pristine, folder)
    file = folder / case.target
    file.write_bytes(case.mutation(random.Random(case.index), file.read_bytes()))
    _rehash(folder)
    return folder


def test_the_fuzz_is_large_and_the_pristine_checkpoint_loads(pristine):
    assert len(CASES) >= 200 and {c.target for c in CASES} == {STATE, POLICY}
    assert load_checkpoint(pristine).meta["iteration"] == 1
    folder, _ = load_meta(pristine)
    assert isinstance(load_policy(folder / ck.POLICY_DIR), GaussianPolicy)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_malformed_safetensors_is_one_typed_error_in_under_a_second(pristine, tmp_path, case):
    folder = _make(pristine, tmp_path, case)
    start = time.perf_counter()
    if case.target == STATE:  # resume path
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(folder)
    else:  # eval path: the checkpoint itself is fine, its exported policy is not
        found, _ = load_meta(folder)
        with pytest.raises(PolicyFileError) as err:
            load_policy(found / ck.POLICY_DIR)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"{case}: {elapsed:.2f} s"
    assert err.value.path.is_relative_to(folder) and "\n" not in str(err.value), str(err.value)


# One malformed file of each kind, through the command line: exit status 2 and one line, no traceback.
CLI_CASES = [next(c for c in CASES if c.mutation is m and c.target == POLICY) for m in ANY_FILE + POLICY_ONLY]


@pytest.mark.parametrize("case", CLI_CASES, ids=str)
def test_eval_command_refuses_a_malformed_policy_file_in_one_line(pristine, tmp_path, case, capsys):
    folder = _make(pristine, tmp_path, case)
    assert main(["eval", f"checkpoint={folder}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot-rl eval: error:") and "\n" not in err and "Traceback" not in err, err
    assert str(folder / ck.POLICY_DIR) in err, err


@pytest.mark.parametrize("case", [c for c in CLI_CASES if c.mutation in ANY_FILE][:6], ids=str)
def test_resume_refuses_a_malformed_state_file_in_one_line(pristine, tmp_path, case, capsys):
    folder = _make(pristine, tmp_path, Case(case.index, STATE, case.mutation))
    assert main(["train", f"resume={folder}", "logger.progress=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot-rl train: error:") and "\n" not in err and "Traceback" not in err, err
    assert str(folder / STATE) in err, err


@pytest.mark.parametrize("target,content", [
    (ck.STATE_TREE, b"{not json"), (ck.STATE_TREE, b"[1, 2]"), (ck.STATE_TREE, b"\xff\xfe"),
    (ck.STATE_TREE, b'{"__type__": "tensor", "key": "/nope"}'), (ck.STATE_TREE, b'{"__type__": "dict", "items": 5}'),
    (ck.STATE_TREE, b'{"__type__": "dict", "items": [["a", {"__type__": "float", "value": "x"}]]}'),
    (ck.META, b"{"), (ck.META, b"[]"), (ck.META, b'{"format": 99}'),
    (ck.MANIFEST, b"{"), (ck.MANIFEST, b'{"files": [1]}'), (ck.MANIFEST, b"7"),
])
def test_malformed_json_in_a_checkpoint_is_a_checkpoint_error(pristine, tmp_path, target, content):
    folder = tmp_path / pristine.name
    shutil.copytree(pristine, folder)
    (folder / target).write_bytes(content)
    if target != ck.MANIFEST:
        _rehash(folder)
    with pytest.raises(CheckpointError, match=target.replace(".", r"\.")):
        load_checkpoint(folder)


def test_a_tree_that_omits_a_tensor_is_refused(pristine, tmp_path):
    """Every tensor of state.safetensors must be named by the tree: a leftover one means the files disagree."""
    folder = tmp_path / pristine.name
    shutil.copytree(pristine, folder)
    tree = json.loads((folder / ck.STATE_TREE).read_text())
    del tree["items"][1]  # the RNG states: their tensors stay in state.safetensors
    (folder / ck.STATE_TREE).write_text(json.dumps(tree))
    _rehash(folder)
    # (the message's own words: the test's tmp folder is named after the test, "omits" and all)
    with pytest.raises(CheckpointError, match=r"names tensors \[\] that state\.safetensors lacks, and omits \['.+'\] "
                                              r"that it holds"):
        load_checkpoint(folder)


def test_the_checker_accepts_what_safetensors_writes_and_knows_its_limits():
    from safetensors.torch import save

    tensors = {"a": torch.ones(3), "b": torch.zeros(2, 2, dtype=torch.int64), "empty": torch.zeros(0, 5),
               "h": torch.ones(4, dtype=torch.bfloat16), "flag": torch.tensor(True)}
    data = save(tensors, metadata={"format": "pt"})
    entries = check_safetensors(data)
    assert {k: e.shape for k, e in entries.items()} == {k: tuple(v.shape) for k, v in tensors.items()}
    assert MAX_TENSORS >= 4096  # room for a large model's weights and optimizer moments
    many = {f"t{i}": torch.zeros(0) for i in range(100)}
    assert len(check_safetensors(save(many), max_tensors=100)) == 100  # at the limit: accepted
    for extra in ({"one_more": torch.zeros(0)}, {f"u{i}": torch.zeros(0) for i in range(200)}):  # both parsers
        with pytest.raises(MalformedFileError, match="more than (the limit of )?100"):
            check_safetensors(save({**many, **extra}), max_tensors=100)
    with pytest.raises(MalformedFileError, match="header length"):
        check_safetensors(data, max_header_bytes=16)


# ------------------------------------------------------------------------------------------------ a full disk
TINY = ["sim.num_envs=8", "algo.num_steps=8", "algo.policy.hidden_dims=[32,32]", "algo.critic.hidden_dims=[32,32]",
        "logger.progress=false", "deterministic=true", "checkpoint_every=1", "checkpoint.keep_last=1",
        "eval.enabled=false"]
ITERATIONS = 5
TOTAL = f"total_steps={8 * 8 * ITERATIONS}"


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True,
                      check=False).returncode != 0:
        return False
    subprocess.run(["umount", str(where)], check=True)
    return True


class SmallDisk:
    """A run folder on a filesystem that can be made (almost) full and then given room again.

    A tmpfs where this process may mount one (root): ``limit(headroom)`` shrinks it to what it holds plus
    ``headroom`` bytes. Elsewhere a file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as Python ignores
    SIGXFSZ) of ``headroom`` bytes on every file written inside ``full()``.
    """

    def __init__(self, root: Path) -> None:
        self.root, self.headroom = root, None
        self.tmpfs = _can_mount_tmpfs(root)
        if self.tmpfs:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(root)], check=True)

    def limit(self, headroom: int) -> None:
        self.headroom = headroom
        if self.tmpfs:
            used = sum(p.stat().st_blocks * 512 for p in self.root.rglob("*") if p.is_file())
            subprocess.run(["mount", "-o", f"remount,size={used + headroom}", str(self.root)], check=True)

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        """Writes past the headroom fail inside this block."""
        if self.tmpfs or self.headroom is None:
            yield
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.headroom, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    def space_is_back(self) -> None:
        self.headroom = None
        if self.tmpfs:
            subprocess.run(["mount", "-o", "remount,size=256m", str(self.root)], check=True)

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", str(self.root)], check=True)


def _train(args: list[str], capsys) -> tuple[int, str]:
    code = main(["train", *TINY, *args])
    return code, capsys.readouterr().err


def _fill(path: Path) -> None:
    """Write zeros into ``path`` until the disk refuses more: a killed writer's partial checkpoint."""
    with contextlib.suppress(OSError), open(path, "wb") as f:
        for _ in range(100_000):
            f.write(b"\0" * 4096)
            f.flush()


def _final_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = load_checkpoint(run_dir)
    assert ckpt.meta["iteration"] == ITERATIONS
    return flatten_tree(ckpt.state)[0]


def _assert_stopped_at_a_write(code: int, err: str, run: Path, good: str) -> None:
    """Exit 4, no traceback, a last line naming the file, the OS error and the checkpoint to resume from."""
    assert code == 4 and "Traceback" not in err, err
    stop = err.strip().splitlines()[-1]
    latest = run / "checkpoints" / good
    assert stop.startswith(f"robot-rl train: stopped: could not write {run / 'checkpoints'}/iter_"), stop
    assert ("No space left on device" in stop or "File too large" in stop) and f"resume={latest}" in stop, stop
    assert load_checkpoint(run).path == latest
    assert not list((run / "checkpoints").glob(".tmp-*"))


def test_a_full_disk_stops_the_run_cleanly_and_resuming_matches_a_run_that_never_failed(tmp_path, capsys):
    reference = tmp_path / "reference"
    code, err = _train([TOTAL, f"run_dir={reference}"], capsys)
    assert code == 0, err
    state_bytes = (load_checkpoint(reference).path / STATE).stat().st_size
    disk = SmallDisk(tmp_path / "disk")
    run = disk.root / "run"
    try:
        code, err = _train(["total_steps=128", f"run_dir={run}"], capsys)  # two iterations with room to spare
        assert code == 0, err
        disk.limit(state_bytes // 2)  # the next checkpoint does not fit beside the one there
        with disk.full():
            code, err = _train([TOTAL, f"resume={run}"], capsys)
        _assert_stopped_at_a_write(code, err, run, "iter_00000002")

        # A writer killed mid-checkpoint left a partial folder that fills the disk: resuming removes it before it
        # writes anything (config, TensorBoard's event file, the curve), goes on, and stops again at the checkpoint.
        stale = run / "checkpoints" / ".tmp-iter_00000003-killed"
        stale.mkdir()
        with disk.full():
            _fill(stale / STATE)
            code, err = _train([TOTAL, f"resume={run}", "logger.tensorboard=true"], capsys)
        assert not stale.exists() and "resumed from" in err, err
        _assert_stopped_at_a_write(code, err, run, "iter_00000002")

        disk.space_is_back()
        code, err = _train([TOTAL, f"resume={run}"], capsys)
        assert code == 0 and "Traceback" not in err, err
        final = _final_tensors(run)
    finally:
        disk.close()
    expected = _final_tensors(reference)
    assert final.keys() == expected.keys()
    differ = [k for k in expected if not (final[k].dtype == expected[k].dtype and torch.equal(final[k], expected[k]))]
    assert not differ, f"not bitwise equal after the resume: {differ[:10]}"


def test_a_failed_checkpoint_write_keeps_the_previous_one_and_names_it(tmp_path):
    """The library underneath the command line: ``CheckpointManager.save`` raises ``OutputWriteError`` with the
    resume hint, removes its partial folder, and leaves ``latest`` on the last complete checkpoint."""
    disk = SmallDisk(tmp_path / "disk")
    root = disk.root / "checkpoints"
    try:
        mgr = CheckpointManager(root)
        small = {"x": torch.arange(10.0)}
        mgr.save(1, small, {})
        disk.limit(64 * 1024)
        with disk.full(), pytest.raises(OutputWriteError) as err:
            mgr.save(2, {"x": torch.zeros(256 * 1024)}, {})  # 1 MiB of tensors: does not fit
        assert err.value.path == root / "iter_00000002" and f"resume={root / 'iter_00000001'}" in str(err.value)
        assert mgr.latest() == root / "iter_00000001"
        assert torch.equal(load_checkpoint(root).state["x"], small["x"])
        assert not list(root.glob(".tmp-*"))
    finally:
        disk.close()


# --------------------------------------------------------------------------------- the other writers of a run
@contextlib.contextmanager
def _file_size_limit(nbytes: int) -> Iterator[None]:
    """Every file this process (and a child such as ffmpeg) writes past ``nbytes`` fails: EFBIG, the kernel's own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_failed_curve_write_stops_the_run_naming_the_last_checkpoint(tmp_path):
    torch.manual_seed(0)
    env = PointReach2D(num_envs=4)
    policy = GaussianPolicy(GaussianPolicyConfig(obs_dim=6, action_dim=2, hidden_dims=[16]))
    algo = PPO(policy, MLPCritic(CriticConfig(obs_dim=7, hidden_dims=[16], obs_key=keys.CRITIC)), PPOConfig())
    cfg = OnPolicyRunnerConfig(num_steps=4, total_steps=16, checkpoint_every=1, success_window=4)
    runner = OnPolicyRunner(env, algo, cfg, RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=False)),
                            CheckpointManager(tmp_path / "checkpoints"), {})
    runner.learn()  # iteration 1 and its checkpoint
    runner.cfg.total_steps = 48
    curve = tmp_path / CURVE_FILE
    with _file_size_limit(curve.stat().st_size + 8), pytest.raises(OutputWriteError) as err:
        runner.learn()  # iteration 2 cannot append its curve point
    good = tmp_path / "checkpoints" / "iter_00000001"
    assert err.value.path == curve and "File too large" in str(err.value) and f"resume={good}" in str(err.value)
    assert runner.checkpoints.latest() == good


def test_tensorboard_plots_and_videos_warn_once_and_the_run_goes_on(tmp_path, caplog, capsys):
    points = [{"env_steps": 64 * i, "wall_s": float(i), "success_rate": 0.1 * i, "mean_return": float(i)}
              for i in range(1, 5)]
    frames = np.zeros((8, 32, 32, 3), dtype=np.uint8)
    with caplog.at_level(logging.WARNING), _file_size_limit(1):
        logger = RunLogger(tmp_path, LoggerConfig(progress=False, tensorboard=True))
        for step in range(3):
            logger.scalars(step, {"loss": 1.0})
        logger.close()
        png = plot_learning_curve(points, tmp_path / "curve.png")
        with pytest.raises(OSError, match="could not finish"):  # ffmpeg says why on its stderr only
            write_video(frames, tmp_path / "policy.mp4")
    warned = [r.getMessage() for r in caplog.records]
    assert sum("TensorBoard is off" in w for w in warned) == 1, warned
    assert png is None and any("no learning-curve plot" in w for w in warned), warned
    assert not (tmp_path / "curve.png").exists() and not (tmp_path / "policy.mp4").exists()
    assert "Traceback" not in capsys.readouterr().err  # TensorBoard's writer thread stays quiet
    assert write_video(frames, tmp_path / "policy.mp4").stat().st_size > 0  # with room, the same call works


def test_a_huge_header_is_parsed_without_garbage_collection(pristine):
    """The parse of a 100,000-entry header makes ~100,000 dicts: with the collector on they set off collections,
    and a full one over a big process heap (the test session's) cost ~0.5 s each, past F3's one-second bound."""
    import gc

    data = _many_zero_size_tensors(random.Random(0), (pristine / STATE).read_bytes())
    started = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with pytest.raises(MalformedFileError, match="more than"):
            check_safetensors(data, "x.safetensors")
    finally:
        gc.callbacks.remove(count)
    # at most the one collection that the allocations made while it was off set off once it is back on (93 without)
    assert len(started) <= 1 and gc.isenabled(), started
