"""Key names for observations, transitions and logs: the one place their spelling is decided."""

# Observation groups (DESIGN.md §3). Each maps to a batched tensor [N, ...] on the env's device.
POLICY = "policy"  # what the actor sees: proprio + task state, float32 [N, D]
CRITIC = "critic"  # privileged state for asymmetric critics, float32 [N, Dc]
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

# Episode statistic names inside info[EPISODE].
EP_RETURN = "return"
EP_LENGTH = "length"
EP_SUCCESS = "success"


def image_key(camera: str) -> str:
    """Observation group name of a camera's images."""
    return IMAGE_PREFIX + camera
