"""The intervention agent of an online run (DESIGN.md §5; HIL-SERL's loop): each step the policy proposes an action,
a person watching gives the one they would (in simulation a scripted expert plays them, acting from the same
observations), the trigger decides from what it saw who acts, and the arbiter mixes the two. Every step says who
acted (``keys.ACTOR``), so the replay keeps the person's transitions apart and a learner can draw them as RLPD's
offline half (``robot_rl.buffers.interventions``).

    agent = InterventionAgent(expert, ActionGap(0.5, 5, 15, N), N)
    applied, actor = agent(obs, policy_action)          # before env.step
    env.step(applied, actor=actor)
    agent.end(terminated | truncated, success)          # episodes that ended start afresh

With a recovery policy and a memory of good states (``robot_rl.hil.recovery``, ``robot_rl.hil.memory``), the
trigger's first ``recoveries`` requests of an episode send the env back to the best-valued remembered state near
it (the memory's key: ``features`` of the frame) before any person is called; a recovery that arrives (or runs
out of steps) hands the env back to the policy with the trigger's history cleared (``handed_back``: drop the
policy's queued actions there), and only a request after that calls the person.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from policies import keys
from robot_rl.hil.arbiter import Arbiter
from robot_rl.hil.memory import StateMemory
from robot_rl.hil.recovery import JointRecovery
from robot_rl.hil.triggers import ActionGap, Trigger, action_gap


class Person(Protocol):
    """Who can take over: a scripted expert in simulation (``sim.experts``), a teleop device on a real arm."""

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """float [N, A] in the env's action units: what they would do now (called every step when they watch, else
        on the steps some env is theirs)."""

    def reset(self, env_ids: torch.Tensor | None) -> None:
        """Envs ``env_ids`` (all: None) start new episodes."""


class InterventionAgent:
    """Policy and person over N envs; the person takes over where ``trigger`` asks (control follows the request:
    the trigger says how long a take-over lasts) and hands back when it stops asking.

    With ``watch`` the person acts every step and the trigger reads the gap between the policy's and the person's
    actions of the previous step (``action_gap``; a person reacts to what they have seen, and the decision is made
    before anyone acts this step). Without it the person acts only on the steps some env is theirs, planning afresh
    from what they see in each env they take over (``person.reset``), and the trigger reads what the caller passes
    (``signal``: V(o_t) for the value triggers, nothing for ``Deadline``): steps nobody takes over then cost nothing.

    Args:
        person: acts from observations.
        trigger: reads the action gap [N] (``ActionGap``), a value [N] or nothing.
        num_envs: N.
        watch: the person acts every step (a trigger that reads the gap needs it).
        latch: a take-over lasts until the env's episode ends (the recap loop's expert), however the trigger goes on.
        recovery: drives an env to a remembered state (reads the frame's ``keys.OBS_STATE``, acts in its units);
            needs ``memory``.
        memory: the states a recovery may go to.
        recoveries: recoveries per episode before a request calls the person.
    """

    def __init__(self, person: Person, trigger: Trigger, num_envs: int, watch: bool = True,
                 latch: bool = False, recovery: JointRecovery | None = None, memory: StateMemory | None = None,
                 recoveries: int = 1) -> None:
        if not watch and isinstance(trigger, ActionGap):
            raise ValueError("ActionGap reads the gap between the policy's and the person's actions: the person must "
                             "watch (act every step)")
        if (recovery is None) != (memory is None):
            raise ValueError("a recovery needs a memory of states to go to, and a memory a recovery to use it")
        if recovery is not None and recoveries < 1:
            raise ValueError(f"recoveries must be >= 1 per episode, got {recoveries}")
        self.recovery, self.memory, self.recoveries = recovery, memory, int(recoveries)
        self.recovered = torch.zeros(num_envs, dtype=torch.long)  # recoveries started in the env's episode
        self.handed_back = torch.zeros(num_envs, dtype=torch.bool)  # a recovery gave the env back this step
        self.recovery_count = 0  # recoveries started, over the run
        self.person, self.trigger, self.watch = person, trigger, watch
        self.arbiter = Arbiter(num_envs, latch=latch)
        self.gap = torch.zeros(num_envs)  # the last step's action gap per env (0 at an episode's start)
        self.touched = torch.zeros(num_envs, dtype=torch.bool)  # someone else acted in the env's current episode
        self.successes = 0  # episodes that ended in success, over the run (for take-overs per success)
        self.episodes = 0

    @property
    def num_envs(self) -> int:
        return int(self.gap.shape[0])

    def __call__(self, obs: dict[str, Any], policy_action: torch.Tensor, signal: torch.Tensor | None = None,
                 features: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's observations and the policy's actions [N, A] (and, for a person who does not watch, what the
        trigger reads: ``signal``; with a recovery, the memory's keys of this step's frames: ``features`` [N, F])
        -> (the actions to apply [N, A], who acts int64 [N] of ``keys.ACTOR_*``, for ``env.step(..., actor=)``)."""
        request = self.trigger(self.gap if self.watch else signal)
        joints = None
        if self.recovery is not None:
            request, joints = self._recover(obs, request, features)
        started, _ = self.arbiter.update(request)
        self.touched |= self.arbiter.taken
        actor = self.arbiter.actor
        applied = policy_action
        if joints is not None and bool(self.recovery.active.any()):
            rec = self.recovery.act(joints).to(policy_action.device, policy_action.dtype)
            applied = torch.where((actor == keys.ACTOR_RECOVERY).to(applied.device)[:, None], rec, applied)
        human = actor == keys.ACTOR_HUMAN
        if not self.watch:
            if not bool(human.any()):
                return applied, actor
            if bool(started.any()):
                self.person.reset(started.nonzero().flatten())
        person_action = self.person.act(obs).to(policy_action.device, policy_action.dtype)
        if self.watch:
            self.gap = action_gap(policy_action, person_action).cpu()
        return torch.where(human.to(applied.device).view(-1, *([1] * (applied.dim() - 1))), person_action,
                           applied), actor

    def _recover(self, obs: dict[str, Any], request: torch.Tensor, features: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recoveries that arrived hand back; new requests in envs with recoveries left start one. Returns the
        requests left for the person and this step's joints."""
        joints = obs[keys.OBS_STATE]
        request = request.to(torch.bool).cpu()
        self.handed_back = self.recovery.done(joints)
        if bool(self.handed_back.any()):
            self.arbiter.release(self.handed_back)
            self.trigger.reset(self.handed_back.nonzero().flatten())  # a new window before it may ask again
            request = request & ~self.handed_back
        new = request & ~self.arbiter.taken & (self.recovered < self.recoveries)
        if bool(new.any()):
            if features is None or features.shape[0] != self.num_envs:
                raise ValueError(f"a recovery needs this step's features [{self.num_envs}, F] for the memory, got "
                                 f"{None if features is None else list(features.shape)}")
            goals, _, _ = self.memory.retrieve(features.cpu()[new])
            self.recovery.start(new, goals)
            self.arbiter.take(new, keys.ACTOR_RECOVERY)
            self.recovered += new.long()
            self.recovery_count += int(new.sum())
            request = request & ~new
        return request, joints

    def alone(self, done: torch.Tensor) -> torch.Tensor:
        """bool [N]: of the episodes ending (``done``), those the policy drove alone from start to end (call before
        ``end``): the runner's success rate and stop rule read only these, so a person's help never counts as
        the policy's success."""
        return done.to(torch.bool) & ~self.touched.to(done.device)

    def end(self, done: torch.Tensor, success: torch.Tensor | None = None) -> None:
        """Envs whose episodes ended this step (bool [N]) start afresh: the person's plan, the trigger, control; their
        outcomes (bool [N], read where ``done``) count for ``report``."""
        done = done.to(torch.bool).cpu()
        if not bool(done.any()):
            return
        ids = done.nonzero().flatten()
        self.episodes += len(ids)
        if success is not None:
            self.successes += int(success.to(torch.bool).cpu()[ids].sum())
        self.person.reset(ids)
        self.trigger.reset(ids)
        self.arbiter.reset(ids)
        self.gap[ids] = 0.0
        self.touched[ids] = False
        self.recovered[ids] = 0
        if self.recovery is not None:
            self.recovery.reset(ids)

    def restart(self) -> None:
        """Every env afresh, as after a resume: the person's plan is not checkpointed (a person does not resume
        bit for bit either); the counts stay."""
        self.person.reset(None)
        self.trigger.reset(None)
        self.arbiter.reset(None)
        self.gap.zero_()
        self.touched.zero_()
        self.recovered.zero_()
        if self.recovery is not None:
            self.recovery.reset(None)

    def report(self) -> dict[str, float]:
        """Over the run: take-overs (recoveries included), the share of steps not the policy's, steps by actor,
        take-overs per success; with a recovery, recoveries and the person's take-overs apart."""
        out = {f"hil/{k}": v for k, v in self.arbiter.report(self.successes).items()}
        if self.recovery is not None:
            person = self.arbiter.takeovers - self.recovery_count
            out.update({"hil/recoveries": float(self.recovery_count), "hil/person_takeovers": float(person),
                        "hil/person_takeovers_per_success": person / self.successes if self.successes
                        else float("nan")})
        return out

    def state_dict(self) -> dict[str, Any]:
        """The run's counts (take-overs, steps by actor, episodes, successes): a resumed run's report continues."""
        return {"takeovers": self.arbiter.takeovers, "steps": self.arbiter.steps.clone(),
                "episodes": self.episodes, "successes": self.successes, "recoveries": self.recovery_count}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.arbiter.takeovers = int(sd["takeovers"])
        self.arbiter.steps = torch.as_tensor(sd["steps"], dtype=torch.long).clone()
        self.episodes, self.successes = int(sd["episodes"]), int(sd["successes"])
        self.recovery_count = int(sd.get("recoveries", 0))  # absent from checkpoints written before recoveries
        self.restart()
