"""Training loops: act -> step -> store -> update -> log -> checkpoint."""
