"""Networks that stay with the learner and never ship to the robot: critics, Q-functions, and (next) value and
reward models. What ships is in ``policies/``."""
