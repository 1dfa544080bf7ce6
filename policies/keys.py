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
# info: bool [N] the env faulted this step (non-finite or diverged state, a non-finite action): terminated, reward 0,
# observation zeroed; learners keep the transition out of their losses (RELIABILITY D1)
FAULTED = "faulted"

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


# LeRobot's frame convention (lerobot.utils.constants, LeRobotDataset v3 columns), where our data, policies and robots
# meet LeRobot's. A "frame" dict batched over N envs or B samples:
#   OBS_STATE               float32 [N, 6]       the SO-101's joint positions in LeRobot's units (degrees), names
#                                                ``sim.so101.LEROBOT_STATE_NAMES`` ("shoulder_pan.pos", ...)
#   OBS_IMAGES + "<camera>" uint8 [N, 3, H, W] from a simulator or robot; float32 in [0, 1] from a dataset
#   TASK                    list[str] of N       the language instruction
#   ACTION_COL              float32 [N, 6]       joint position targets in degrees (what a leader arm sends);
#                                                a chunk [N, H, 6] with ACTION_IS_PAD bool [N, H] in training batches
OBS_STATE = "observation.state"
OBS_IMAGES = "observation.images."  # + camera name, e.g. "observation.images.front"
TASK = "task"
ACTION_COL = "action"
ACTION_IS_PAD = "action_is_pad"  # bool: the chunk's step lies past the episode's end (LeRobot's name)
# float32 [N, L, 6]: OBS_STATE as it was l = lags[0..L-1] frames earlier (the episode's first frame where it is
# younger): how the joints move, which one frame's positions cannot show (the value model's ``state_lags``)
OBS_STATE_LAGS = "observation.state_lags"
# Outcome and correction columns (LeRobot's names, so our datasets and LeRobot's mix).
SUCCESS_COL = "next.success"  # bool [1]: the task is solved at this frame (what lerobot-eval writes)
REWARD_COL = "next.reward"  # float32 [1]
DONE_COL = "next.done"  # bool [1]: the episode's last frame
INTERVENTION_COL = "intervention"  # bool [1]: someone other than the policy acted (LeRobot's DAgger tag)
POLICY_ACTION_COL = "policy_action"  # float32 [6]: what the policy proposed, where a policy acted (else = action)
ACTOR_COL = "actor"  # int64 [1]: who acted, one of ACTOR_* (policy, human, recovery)
# float32 [1]: s from the episode's first read of the robot to this frame's, measured (LeRobot's `timestamp` is
# frame_index / fps whatever the loop did); robot-rl deploy writes it, robot_rl.data.timing checks it
CAPTURE_TIME_COL = "capture_time"
# What a state-based learner needs besides LeRobot's frame (written by ``robot-rl collect env_state=true``):
ENV_STATE_COL = "observation.environment_state"  # float32 [D]: the env's POLICY observation (LeRobot's own name for
#                                                  privileged state, lerobot.utils.constants.OBS_ENV_STATE)
ENV_CRITIC_STATE_COL = "env_critic_state"  # float32 [Dc]: the env's CRITIC observation, where it has one
ENV_ACTION_COL = "env_action"  # float32 [A]: the action in the env's own space (in [-1, 1]) that the env applied
# (the last two start with neither "observation" nor "action", so LeRobot's policies do not take them for inputs)


def lerobot_image_key(camera: str) -> str:
    """LeRobot's feature name of a camera's images."""
    return OBS_IMAGES + camera
