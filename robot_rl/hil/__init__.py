"""The human-in-the-loop agent's parts (DESIGN.md §5): triggers that ask for a take-over, and the arbiter that
decides, step by step and env by env, who acts -- the policy, a person (or a scripted expert playing one), or a
recovery policy (``JointRecovery``, driving the arm to a state of the ``StateMemory``)."""

from robot_rl.hil.agent import InterventionAgent, Person
from robot_rl.hil.arbiter import Arbiter
from robot_rl.hil.memory import StateMemory
from robot_rl.hil.recovery import JointRecovery
from robot_rl.hil.triggers import (
    ActionGap,
    Deadline,
    Polled,
    Trigger,
    ValueStall,
    ValueThreshold,
    action_gap,
    window_slopes,
)

__all__ = ["ActionGap", "Arbiter", "Deadline", "InterventionAgent", "JointRecovery", "Person", "Polled", "StateMemory",
           "Trigger", "ValueStall", "ValueThreshold", "action_gap", "window_slopes"]
