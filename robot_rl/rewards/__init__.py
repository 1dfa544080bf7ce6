"""Dense rewards (DESIGN.md §5): shaping the task's reward by a potential -- a progress model, a value model, a
distance -- that tells the learner at every step whether it got closer."""

from robot_rl.rewards.shaping import Potential, ShapedEnv, shaping_term

__all__ = ["Potential", "ShapedEnv", "shaping_term"]
