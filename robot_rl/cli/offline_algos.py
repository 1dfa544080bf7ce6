"""The learners of ``robot-rl offline``, one table entry each: every one is behaviour cloning of the flow VLA
(``robot_rl.algos.bc.BC``), and an entry says what its learner adds. ``robot_rl/cli/offline.py`` reads the table, so
a new offline learner is a new entry (and its ``configs/algo/<name>.yaml``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from robot_rl.algos.awr import AWRConfig, awr_sampler
from robot_rl.algos.recap import RecapConfig, recap_policy_overrides, recap_sampler
from robot_rl.data.labels import Labels


@dataclass(frozen=True)
class OfflineAlgoSpec:
    """What an offline learner adds to behaviour cloning (nothing, for BC itself)."""

    # Its own config section ``algo.<section>.*`` and the dataclass it is typed as; None: none.
    section: str | None = None
    config: type | None = None
    # The ``algo.policy`` section as the learner trains it (may refuse settings it cannot train with); None: as given.
    policy_overrides: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    policy_keys: tuple[str, ...] = ()  # algo.policy keys that policy_overrides decides: left out of its schema
    # (the data's sampler, the advantage labels, the section's config) -> the sampler the policy trains on. Set: the
    # learner first fits the value model and labels the frames (``algo.value.*``, ``algo.labels.*``,
    # ``robot_rl.algos.advantages``), and needs the dataset's outcomes. None: it trains on the data's sampler.
    labels_sampler: Callable[[Any, Labels, Any], Any] | None = None

    def __post_init__(self) -> None:
        if (self.section is None) != (self.config is None):
            raise ValueError("an offline learner's section and config go together")

    @property
    def uses_advantages(self) -> bool:
        """Whether the learner needs the value model and the advantage labels."""
        return self.labels_sampler is not None


OFFLINE_ALGO_SPECS: dict[str, OfflineAlgoSpec] = {
    "bc": OfflineAlgoSpec(),
    "recap": OfflineAlgoSpec(section="recap", config=RecapConfig, policy_overrides=recap_policy_overrides,
                             policy_keys=("conditioning",), labels_sampler=recap_sampler),
    "awr": OfflineAlgoSpec(section="awr", config=AWRConfig, labels_sampler=awr_sampler),
}
OFFLINE_ALGOS = tuple(OFFLINE_ALGO_SPECS)  # the algo= choices robot-rl offline takes
