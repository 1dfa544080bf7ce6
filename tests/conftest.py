import os

# Offscreen rendering backend must be chosen before mujoco is imported (EGL; osmesa also works with libosmesa6).
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

import torch

torch.set_num_threads(1)  # small networks: more threads only add contention on 2 cores
