"""Key names for observations, transitions and logs: the one place their spelling is decided."""

# Observation groups (DESIGN.md §3). Each maps to a batched tensor [N, ...] on the env's device.
POLICY = "policy"  # what the actor sees: proprio + task state, float32 [N, D]
CRITIC = "critic"  # privileged state for asymmetric critics, float32 [N, Dc]
PROPRIO = "proprio"  # what the robot itself measures (the SO-101's six joint positions, rad), float32 [N, P]
IMAGE_PREFIX = "image."  # one group per camera: "image.front", "image.wrist"; uint8 [N, 3, H, W]

# Transition / info keys.
OBS = "obs"
NEXT_OBS = "next_obs"
ACTION = "action"
REWARD = "reward"
TERMINATED = "terminated"
TRUNCATED = "truncated"
FINAL_OBS = "final_obs"  # info: the true last observation of envs that auto-reset this step
EPISODE = "episode"  # info: per-env statistics, valid where terminated | truncated
SUCCESS = "success"
LOG = "log"  # info: dict of float scalars for the logger ("reward/<term>", counters)
APPLIED_ACTION = "applied_action"  # info: float32 [N, A] the action really applied (sanitised, clipped to [-1, 1])
ACTOR = "actor"  # info: int64 [N] who chose this step's action, one of ACTOR_*

# Who acted (values of info[ACTOR]); LeRobot's ``intervention`` column is ``actor != ACTOR_POLICY``.
ACTOR_POLICY = 0
ACTOR_HUMAN = 1
ACTOR_RECOVERY = 2
ACTOR_NAMES = ("policy", "human", "recovery")  # indexed by the values above

# Episode statistic names inside info[EPISODE].
EP_RETURN = "return"
EP_LENGTH = "length"
EP_SUCCESS = "success"


def image_key(camera: str) -> str:
    """Observation group name of a camera's images."""
    return IMAGE_PREFIX + camera
