"""LeRobot pipelines of a ``robot_rl`` policy: only renaming, batching and device placement. Normalisation and the
unit conversions live inside the policy (its own processor travels with its weights)."""

from __future__ import annotations

from typing import Any

import torch
from lerobot.processor import (
    AddBatchDimensionProcessorStep,
    DeviceProcessorStep,
    PolicyAction,
    PolicyProcessorPipeline,
    RenameObservationsProcessorStep,
)
from lerobot.processor.factory import make_policy_processor_pipelines

from real.lerobot_policy.configuration_robot_rl import RobotRLConfig


def make_robot_rl_pre_post_processors(
    config: RobotRLConfig, dataset_stats: dict[str, dict[str, torch.Tensor]] | None = None
) -> tuple[PolicyProcessorPipeline[dict[str, Any], dict[str, Any]], PolicyProcessorPipeline[PolicyAction, PolicyAction]]:
    """(preprocessor: rename -> add batch dim -> to the policy's device, postprocessor: to the CPU).
    ``dataset_stats`` is ignored: the policy normalises with the statistics it was trained with."""
    return make_policy_processor_pipelines(
        input_steps=[RenameObservationsProcessorStep(rename_map={}), AddBatchDimensionProcessorStep(),
                     DeviceProcessorStep(device=config.device)],
        output_steps=[DeviceProcessorStep(device="cpu")],
    )
