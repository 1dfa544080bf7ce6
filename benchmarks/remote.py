"""The actor/learner split (DESIGN.md §7, RELIABILITY.md E1-E3): learning, faults and large payloads, measured.

1. Learning: FlashSAC on so101_reach with its recipe, to 90 % rolling training success (at most 200 k env steps),
   ``one`` (``robot-rl train``: one process, 16 envs) against ``split`` (``robot-rl train remote.listen=...`` + one
   ``robot-rl actor`` process of 16 envs, both on this machine), seeds alternated, one run at a time. Recorded: env
   steps and training wall-clock to 90 % (the learner's loop clock; start-up excluded, as for ``one``).
2. The fault drill (``fault_drill``; ``tests/test_remote.py`` runs it small): a learner and actor A; A killed with
   SIGKILL and B started on its slot (E2: connected within 10 s); the learner killed with SIGKILL (E1: B notices
   within 5 s and holds), restarted from its last checkpoint on the same port (B back within 30 s); at the end the
   final checkpoint's replay is checked for lost and duplicated transitions (sequence numbers and the unbroken
   o' -> o chain of every env).
3. E3: a 1 GiB parameter blob through the learner's ``Parameters`` stream on localhost, reassembled and checked.

With ``--demos N``: N scripted demonstrations (``robot-rl collect ... env_state=true``) as both arms'
``demo_dataset`` (RLPD's 50/50 batches; with the split they stay with the learner), written to
``remote_demos.json`` / ``.png`` beside the runs without demos that ``remote.json`` holds. With ``--hil``: the
scripted expert as HIL-SERL's person (``hil.person=expert``, its default deadline judge), on ``robot-rl train`` in
one process and on the actor in the split (where the envs are); success counts the policy's own episodes; written
to ``remote_hil.json`` / ``.png`` with the expert's env steps.

    python benchmarks/remote.py                 # 2 seeds + drill + 1 GiB: ~15 min on 2 cores
    python benchmarks/remote.py --seeds 1 --skip-blob --out /tmp/res
    python benchmarks/remote.py --seeds 3 --demos 50 --skip-drill --skip-blob   # remote_demos.json: ~11 min
    python benchmarks/remote.py --seeds 3 --hil --skip-drill --skip-blob         # remote_hil.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, goal, save_figure, write_result

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 200_000
TOKEN = "benchmark-token"
TRAIN = ["train", "task=so101_reach", "algo=flashsac", "stop_success_rate=0.9", f"total_steps={BUDGET}",
         "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_vars() -> dict[str, str]:
    return {**os.environ, "ROBOT_RL_TOKEN": TOKEN, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
            "PYTHONPATH": str(ROOT)}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "robot_rl.cli.main", *args]


def actor_command(port: int, spool: Path, *extra: str) -> list[str]:
    return cli("actor", "task=so101_reach", f"remote.address=127.0.0.1:{port}", f"remote.spool_dir={spool}", *extra)


def curve_to_90(run_dir: Path) -> dict[str, Any]:
    points = [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
    hit = next((p for p in points if (p.get("success_rate") or 0.0) >= 0.9), None)
    last = points[-1]
    expert = None  # env steps a person drove up to the target (hil.person in one process: its curve's rates)
    if hit is not None and any("intervention_rate" in p for p in points):
        before, expert = 0, 0.0
        for p in points[:points.index(hit) + 1]:
            expert += p.get("intervention_rate", 0.0) * (p["env_steps"] - before)
            before = p["env_steps"]
    return {"env_steps_to_90": None if hit is None else hit["env_steps"],
            **({} if expert is None else {"expert_steps_to_90": round(expert)}),
            "wall_s_to_90": None if hit is None else round(hit["wall_s"], 2), "env_steps": last["env_steps"],
            "wall_s": round(last["wall_s"], 2), "env_steps_per_s": round(last["env_steps"] / last["wall_s"], 1)}


def run_one(seed: int, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        p = subprocess.run(cli(*TRAIN, f"seed={seed}", f"run_dir={run_dir}", *extra), cwd=ROOT, env=env_vars(),
                           capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise SystemExit(f"one seed {seed} failed:\n{p.stderr[-3000:]}")
        return {"seed": seed, **curve_to_90(run_dir)}


def run_split(seed: int, learner_extra: tuple[str, ...] = (), actor_extra: tuple[str, ...] = ()) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, port, log = Path(tmp) / "run", free_port(), Path(tmp) / "learner.log"
        learner = subprocess.Popen(cli(*TRAIN, f"seed={seed}", f"run_dir={run_dir}",
                                       f"remote.listen=127.0.0.1:{port}", *learner_extra),
                                   cwd=ROOT, env=env_vars(), stdout=log.open("wb"), stderr=subprocess.STDOUT)
        actor = subprocess.Popen(actor_command(port, Path(tmp) / "spool", f"seed={seed}", *actor_extra), cwd=ROOT,
                                 env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = actor.communicate(timeout=3600)
            if learner.wait(timeout=120) != 0 or actor.returncode != 0:
                raise SystemExit(f"split seed {seed} failed:\n{log.read_text()[-3000:]}\n{err[-3000:]}")
        finally:
            for p in (learner, actor):
                if p.poll() is None:
                    p.kill()
        report = json.loads(out)
        out = {"seed": seed, **curve_to_90(run_dir), "actor_wait_s": round(report["wait_s"], 1),
               "policies_received": report["policies"]}
        if report.get("hil"):  # a person on the actor: the run stops at the target, so these are its steps to it
            out["expert_steps_to_90"] = report["intervention_steps"]
        return out


# ------------------------------------------------------------------------------------------------ drill
def _wait_for(what: str, cond: Callable[[], bool], timeout: float, *logs: Path) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            raise AssertionError(f"{what}: not within {timeout} s\n{tails}")
        time.sleep(0.02)
    return time.monotonic()


def _checkpoints(run: Path) -> int:
    return len(list((run / "checkpoints").glob("iter_*")))


def fault_drill(tmp: Path, total_steps: int = 12_000, num_envs: int = 4, steps_per_message: int = 2,
                small: bool = True) -> dict[str, Any]:
    """Kill an actor, then the learner, with SIGKILL during a run; returns what was measured and the final
    checkpoint's stream check (see the module docstring). ``small``: tiny networks and batches (the test's)."""
    from robot_rl.checkpoint import load_checkpoint

    port, run, llog = free_port(), tmp / "run", tmp / "learner.log"
    learner_args = [*TRAIN[:2], "algo=flashsac", f"remote.listen=127.0.0.1:{port}", f"sim.num_envs={num_envs}",
                    f"total_steps={total_steps}", "checkpoint_every=2", "eval.enabled=false", "logger.progress=false",
                    "logger.tensorboard=false", f"run_dir={run}", "algo.steps_per_iteration=8"]
    if small:
        learner_args += ["algo.learning_starts=64", "algo.batch_size=32", "algo.actor.hidden_dim=16",
                         "algo.critic.hidden_dim=16", "remote.max_lead_steps=16", "torch_threads=1"]
    actor_args = [f"sim.num_envs={num_envs}", "remote.heartbeat_s=0.2", "remote.deadline_s=1.0", "remote.max_missed=2",
                  f"remote.steps_per_message={steps_per_message}", "remote.connect_timeout_s=60"]

    def actor(name: str) -> tuple[subprocess.Popen, Path]:
        err = tmp / f"{name}.err"
        p = subprocess.Popen(actor_command(port, tmp / f"spool_{name}", *actor_args), cwd=ROOT, env=env_vars(),
                             stdout=(tmp / f"{name}.out").open("wb"), stderr=err.open("wb"))
        return p, err

    def learner(*extra: str) -> subprocess.Popen:
        return subprocess.Popen(cli(*learner_args, *extra), cwd=ROOT, env=env_vars(), stdout=llog.open("ab"),
                                stderr=subprocess.STDOUT)

    out: dict[str, Any] = {}
    procs = [learner()]
    try:
        a, a_err = actor("a")
        procs.append(a)
        _wait_for("the learner writes a checkpoint", lambda: _checkpoints(run) >= 1, 120, llog, a_err)
        a.send_signal(signal.SIGKILL)
        a.wait()
        start = time.monotonic()
        b, b_err = actor("b")
        procs.append(b)
        out["replacement_connect_s"] = _wait_for(
            "B connects", lambda: "connected to the learner" in b_err.read_text(), 60, b_err, llog) - start
        n0 = _checkpoints(run)
        _wait_for("checkpoints of B's transitions", lambda: _checkpoints(run) >= n0 + 2, 120, llog, b_err)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        killed = time.monotonic()
        out["learner_loss_detected_s"] = _wait_for("B holds", lambda: "holding" in b_err.read_text(), 30, b_err) - killed
        time.sleep(1.0)
        out["acted_while_learner_dead"] = "acting again" in b_err.read_text()
        out["spooled_while_dead"] = len(list((tmp / "spool_b").glob("*.msg")))
        restart = time.monotonic()
        procs.append(learner(f"resume={run}"))
        out["reconnect_after_restart_s"] = _wait_for(
            "B acts again", lambda: "acting again" in b_err.read_text(), 120, b_err, llog) - restart
        out["learner_rc"] = procs[-1].wait(timeout=600)
        out["actor_rc"] = b.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    report = json.loads((tmp / "b.out").read_text())
    out["actor_report"] = report
    out["resumed"] = "resumed from" in llog.read_text()
    runner = load_checkpoint(run).state["runner"]
    received, steps = runner["remote"]["received"][0], runner["remote"]["steps"][0]
    replay = runner["replays"][0]
    size = int(replay["size"])
    obs, nxt = replay["obs"]["policy"][:size], replay["next_obs"]["policy"][:size]
    ended = replay["terminated"][:size] | replay["truncated"][:size]
    cont = ~ended[:-1]
    broken = int(((nxt[:-1] != obs[1:]).any(dim=-1) & cont).sum())
    out.update(messages=received + 1, steps_stored=steps, steps_expected=(received + 1) * steps_per_message,
               env_steps=runner["env_steps"], replay_rows=size, chain_links=int(cont.sum()), chain_breaks=broken,
               missing_or_duplicated_steps=abs(steps - (received + 1) * steps_per_message))
    return out


# ------------------------------------------------------------------------------------------------ E4
class SlowLink:
    """A userspace stand-in for ``tc netem`` (whose qdisc this machine's kernel lacks): a TCP proxy on localhost
    that holds every chunk it forwards, each way, for ``delay_s``, plus a retransmission wait for each time it
    "loses" it (probability ``loss`` per try, as TCP would resend a lost segment: 0.2 s, then doubling), keeping each
    direction's byte order. Not packet loss itself (TCP hides that from both ends anyway): the delays it causes."""

    def __init__(self, target_port: int, delay_s: float = 0.5, loss: float = 0.3, seed: int = 0) -> None:
        self.target, self.delay_s, self.loss = target_port, delay_s, loss
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _hold_s(self) -> float:
        with self.lock:
            extra, rto = 0.0, 0.2
            while self.rng.random() < self.loss:
                extra, rto = extra + rto, min(rto * 2, 3.0)
        return self.delay_s + extra

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the learner is not up (yet): the client sees the connection drop and retries
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        q: queue.Queue = queue.Queue()

        def send() -> None:
            while True:
                due, data = q.get()
                if data is None:
                    break
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    dst.sendall(data)
                except OSError:
                    break
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=send, daemon=True).start()
        last = 0.0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                q.put((0.0, None))
                return
            last = max(last, time.monotonic() + self._hold_s())  # in order: never before the previous chunk
            q.put((last, data))

    def close(self) -> None:
        self.closed = True
        self.server.close()


def degraded_network(minutes: float = 10.0, delay_s: float = 0.5, loss: float = 0.3) -> dict[str, Any]:
    """E4: a learner and one actor of 16 envs for ``minutes`` through ``SlowLink`` (the actor never waits for the
    training, ``remote.max_lead_steps=null``, as a robot's should not): the actor's control-loop ticks, its safe
    holds and reconnects, and whether the learner kept training (its updates per minute)."""
    with tempfile.TemporaryDirectory() as tmp:
        run, port, llog = Path(tmp) / "run", free_port(), Path(tmp) / "learner.log"
        learner = subprocess.Popen(cli(*TRAIN[:3], f"total_steps={10**9}", f"max_minutes={minutes}",
                                       "eval.enabled=false", "logger.progress=false", "logger.tensorboard=false",
                                       f"run_dir={run}", f"remote.listen=127.0.0.1:{port}",
                                       "remote.max_lead_steps=null"),
                                   cwd=ROOT, env=env_vars(), stdout=llog.open("wb"), stderr=subprocess.STDOUT)
        link = SlowLink(port, delay_s, loss)
        actor = subprocess.Popen(actor_command(link.port, Path(tmp) / "spool", "remote.connect_timeout_s=120"),
                                 cwd=ROOT, env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = time.monotonic()
        try:
            out, err = actor.communicate(timeout=60 * minutes + 600)
            learner_rc = learner.wait(timeout=300)
        finally:
            for p in (learner, actor):
                if p.poll() is None:
                    p.kill()
            link.close()
        wall = time.monotonic() - start
        if actor.returncode != 0 or learner_rc != 0:
            raise SystemExit(f"degraded-network drill failed:\n{llog.read_text()[-3000:]}\n{err[-3000:]}")
        report = json.loads(out)
        points = [json.loads(line) for line in (run / "curve.jsonl").read_text().splitlines()]
        per_minute: dict[int, int] = {}
        for p in points:
            per_minute[int(p["wall_s"] // 60)] = int(p["updates"])
        updates = [per_minute[m] - per_minute.get(m - 1, 0) for m in sorted(per_minute)]
    return {"minutes": minutes, "delay_s": delay_s, "loss": loss, "wall_s": round(wall, 1),
            "emulation": "userspace TCP proxy (SlowLink), not tc netem: this kernel has no netem qdisc",
            "tick_ms": report["tick_ms"], "vector_steps": report["vector_steps"], "messages": report["messages"],
            "holds": report["holds"], "hold_s": round(report["hold_s"], 1), "reconnects": report["reconnects"],
            "dropped": report["dropped"], "policies_received": report["policies"],
            "stopped_by_learner": report["stopped_by_learner"], "updates_per_minute": updates,
            "env_steps_received": points[-1]["env_steps"], "updates": points[-1]["updates"]}


def plot_degraded(d: dict[str, Any], path: Path) -> None:
    """remote_degraded.png: the learner's updates per minute and the actor's control ticks (p50, p99, the 40 ms
    bound) through the slow link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ups = d["updates_per_minute"]
    axes[0].bar(range(len(ups)), ups, color="C0", alpha=0.7)
    axes[0].set_xlabel("minute of the run")
    axes[0].set_ylabel("learner updates")
    t = d["tick_ms"]
    axes[1].bar([0, 1], [t["p50"], t["p99"]], color=["C1", "C3"], alpha=0.7)
    axes[1].axhline(40.0, color="k", ls="--", lw=1, label="E4 bound (p99 40 ms)")
    axes[1].set_xticks([0, 1], ["p50", "p99"])
    axes[1].set_ylabel("actor control tick (ms)")
    axes[1].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"E4: {d['delay_s']} s delay + {d['loss']:.0%} loss (userspace proxy) for {d['minutes']:g} min")
    save_figure(fig, path)


# ------------------------------------------------------------------------------------------------ E3
def blob_transfer(size: int = 2**30) -> dict[str, Any]:
    """One ``size``-byte blob through ``Parameters`` on localhost: seconds, MB/s, digest equal."""
    import torch

    from robot_rl.remote import wire
    from robot_rl.remote.hub import LearnerHub, Spec
    from robot_rl.remote.service import LearnerClient, serve

    blob = os.urandom(size)
    hub = LearnerHub(Spec("t", 1, 1, {}, {}), 1)
    hub.publish(blob)
    server, port = serve(hub.handlers(), "127.0.0.1:0", TOKEN)
    try:
        client = LearnerClient(f"127.0.0.1:{port}", TOKEN)
        start = time.perf_counter()
        r, got, chunks = wire.Reassembler(), None, 0
        for chunk in client.stream("Parameters", wire.encode({"kind": "pull", "version": 0}), 600.0):
            chunks += 1
            got = r.add(chunk) or got
        dt = time.perf_counter() - start
        client.close()
    finally:
        server.stop(0)
    ok = got is not None and hashlib.sha256(got[0]).digest() == hashlib.sha256(blob).digest()
    del torch
    return {"bytes": size, "chunks": chunks, "seconds": round(dt, 2), "mb_per_s": round(size / dt / 1e6, 1),
            "intact": ok}


def collect_demos(root: Path, episodes: int) -> dict[str, Any]:
    """``episodes`` scripted so101_reach demonstrations with the env's state (what FlashSAC reads) at ``root``."""
    p = subprocess.run(cli("collect", "task=so101_reach", f"episodes={episodes}", f"dataset.root={root}",
                           "env_state=true", "task.cameras=[]", "progress=false"), cwd=ROOT, env=env_vars(),
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"collecting demos failed:\n{p.stderr[-3000:]}")
    return {"episodes": episodes, "log": p.stderr.strip().splitlines()[-1]}


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, labels: dict[str, str] | None = None,
         title: str = "FlashSAC so101_reach: actor/learner split vs one process") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "env_steps_to_90", "env steps to 90 % success"),
                           (axes[1], "wall_s_to_90", "training wall-clock to 90 % (s)")):
        for i, (arm, rs) in enumerate(runs.items()):
            vals = [r[key] for r in rs if r[key] is not None]
            if vals:
                ax.bar(i, statistics.median(vals), color=f"C{i}", alpha=0.6)
                ax.scatter([i] * len(vals), vals, color="k", s=12, zorder=3)
        names = labels or {"one": "one process\n16 envs", "split": "learner + actor\n16 envs"}
        ax.set_xticks(range(len(runs)), [names[arm] for arm in runs])
        ax.set_ylabel(label)
    fig.suptitle(f"{title} (bars: medians, dots: seeds)")
    save_figure(fig, path)


def replot(out: Path) -> None:
    """remote.png from remote.json: the headline arms, and the lead-8 run where the JSON has it."""
    d = json.loads((out / "remote.json").read_text())
    runs, labels = dict(d["runs"]), {"one": "one process\n16 envs", "split": "learner + actor\nlead 64, every 20"}
    if "split_lead8_publish2" in d:
        runs["split_lead8"] = d["split_lead8_publish2"]["runs"]
        labels["split_lead8"] = "learner + actor\nlead 8, every 2"
    plot(runs, out / "remote.png", labels)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--skip-learning", action="store_true")
    p.add_argument("--skip-drill", action="store_true")
    p.add_argument("--skip-blob", action="store_true")
    p.add_argument("--arms", nargs="+", default=["one", "split"], choices=["one", "split"])
    p.add_argument("--learner-args", nargs="*", default=[], help="extra learner settings of the split arm")
    p.add_argument("--demos", type=int, default=0, help="scripted demos as both arms' demo_dataset (remote_demos)")
    p.add_argument("--hil", action="store_true", help="the scripted expert as the person, both arms (remote_hil)")
    p.add_argument("--degraded-minutes", type=float, default=0.0,
                   help="E4: a learner and actor through a slow, lossy link for this long (remote_degraded)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON in --out; no runs")
    a = p.parse_args()
    if a.replot:
        replot(a.out)
        return
    data: dict[str, Any] = {"train_command": " ".join(["robot-rl", *TRAIN]), "cores": os.cpu_count()}
    goals = []
    if a.demos and a.hil:
        p.error("--demos and --hil are separate variants: run them one at a time")
    if a.degraded_minutes:  # E4 alone
        data = {"degraded_network": degraded_network(a.degraded_minutes)}
        d = data["degraded_network"]
        print(json.dumps(d), flush=True)
        goals = [goal("e4_control_tick_p99_ms", d["tick_ms"]["p99"], 40.0, "<="),
                 goal("e4_finished_without_deadlock", float(d["stopped_by_learner"]), 1.0, ">="),
                 goal("e4_learner_updates_every_minute", float(min(d["updates_per_minute"][1:-1] or [0]) > 0), 1.0,
                      ">=")]
        a.out.mkdir(parents=True, exist_ok=True)
        plot_degraded(d, a.out / "remote_degraded.png")
        path = write_result("remote_degraded", data, goals, a.out)
        print(json.dumps(goals, indent=2))
        print(f"wrote {path}")
        return
    variant = "demos" if a.demos else "hil" if a.hil else None
    name = f"remote_{variant}" if variant else "remote"
    demo_dir = tempfile.TemporaryDirectory()
    one_args: tuple[str, ...] = ()
    learner_args, actor_args = tuple(a.learner_args), ()
    if a.demos and not a.skip_learning:
        data["demos"] = collect_demos(Path(demo_dir.name) / "demos", a.demos)
        one_args = (f"demo_dataset.root={Path(demo_dir.name) / 'demos'}",)
        learner_args += one_args
    if a.hil:  # the person is where the envs are: on robot-rl train in one process, on the actor in the split
        one_args, actor_args = ("hil.person=expert",), ("hil.person=expert",)
    if not a.skip_learning:
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in a.arms}
        arms = {"one": lambda seed: run_one(seed, one_args),
                "split": lambda seed: run_split(seed, learner_args, actor_args)}
        data["split_learner_args"] = a.learner_args
        for seed in range(a.seeds):  # one run at a time, arms alternated
            for arm in a.arms:
                r = arms[arm](seed)
                runs[arm].append(r)
                print(f"{arm} seed {seed}: {r}", flush=True)

        def med(arm: str, key: str, budget: float) -> float:
            return statistics.median(budget if r[key] is None else float(r[key]) for r in runs[arm])

        summary = {arm: {"median_env_steps_to_90": med(arm, "env_steps_to_90", BUDGET),
                         "median_wall_s_to_90": med(arm, "wall_s_to_90", max(r["wall_s"] for r in runs[arm])),
                         "reached_90": sum(r["env_steps_to_90"] is not None for r in runs[arm])} for arm in runs}
        data.update(runs=runs, summary=summary)
        if len(runs) == 2:
            goals += [goal("env_steps_to_90_ratio_split_vs_one", summary["split"]["median_env_steps_to_90"]
                           / summary["one"]["median_env_steps_to_90"], 1.25, "<="),
                      goal("split_reached_90_all_seeds", summary["split"]["reached_90"], a.seeds, ">=")]
        for arm, rs in runs.items():
            expert = [r["expert_steps_to_90"] for r in rs if "expert_steps_to_90" in r]
            if expert:
                summary[arm]["median_expert_steps_to_90"] = statistics.median(expert)
        if variant and (RESULTS / "remote.json").is_file():  # the same runs without the variant, as recorded
            without = json.loads((RESULTS / "remote.json").read_text())
            data[f"without_{variant}"] = {
                "source": "remote.json: one process from its headline runs, the split from split_lead8_publish2 (the "
                          "defaults), the same seeds",
                "one": without["summary"]["one"], "split": without["split_lead8_publish2"]["summary"]}
            for arm in runs:
                goals.append(goal(f"env_steps_to_90_ratio_{arm}_{variant}_vs_{arm}",
                                  summary[arm]["median_env_steps_to_90"]
                                  / data[f"without_{variant}"][arm]["median_env_steps_to_90"], 1.0, "<="))
        a.out.mkdir(parents=True, exist_ok=True)
        extra = {"demos": " + demos", "hil": " + expert person"}.get(variant or "", "")
        labels = {"one": f"one process\n16 envs{extra}", "split": f"learner + actor\n16 envs{extra}"}
        title = {"demos": f"FlashSAC so101_reach with {a.demos} demos: split vs one process",
                 "hil": "FlashSAC so101_reach, the expert as the person (HIL): split vs one process"}
        plot(runs, a.out / f"{name}.png", labels if variant else None,
             title.get(variant or "", "FlashSAC so101_reach: actor/learner split vs one process"))
    if not a.skip_drill:
        with tempfile.TemporaryDirectory() as tmp:
            drill = fault_drill(Path(tmp), small=False, num_envs=16, total_steps=30_000, steps_per_message=4)
        data["fault_drill"] = drill
        print(json.dumps(drill), flush=True)
        goals += [goal("e2_replacement_actor_connect_s", drill["replacement_connect_s"], 10.0, "<="),
                  goal("e1_learner_loss_detected_s", drill["learner_loss_detected_s"], 5.0, "<="),
                  goal("e1_reconnect_after_restart_s", drill["reconnect_after_restart_s"], 30.0, "<="),
                  goal("e1_missing_or_duplicated_steps", drill["missing_or_duplicated_steps"], 0, "<="),
                  goal("e1_chain_breaks", drill["chain_breaks"], 0, "<=")]
    if not a.skip_blob:
        data["blob_1gib"] = blob = blob_transfer()
        print(json.dumps(blob), flush=True)
        goals.append(goal("e3_1gib_blob_intact", float(blob["intact"]), 1.0, ">="))
    demo_dir.cleanup()
    path = write_result(name, data, goals, a.out)
    print(json.dumps(goals, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
