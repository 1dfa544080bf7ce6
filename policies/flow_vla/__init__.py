"""The flow-matching VLA: config, encoders, flow-matching math, network and the deployable policy."""

from policies.flow_vla.config import CONDITION_KEY, FlowVLAConfig
from policies.flow_vla.policy import FlowVLAPolicy

__all__ = ["CONDITION_KEY", "FlowVLAConfig", "FlowVLAPolicy"]
