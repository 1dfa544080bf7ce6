"""Learning algorithms. Each owns its critics, targets and optimizers; none ever calls ``env.step``."""
