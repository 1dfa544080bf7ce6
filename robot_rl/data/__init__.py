"""Logged data for offline learning: samplers over transitions (LeRobotDataset v3 reading and writing joins)."""
