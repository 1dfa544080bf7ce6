"""STAND-IN assets for Isaac Lab's ``Isaac-Cartpole`` task, for machines that cannot reach NVIDIA's asset server.

The task loads two USD files from ``{ISAACSIM_ASSET_ROOT}/Isaac/IsaacLab/...`` (Isaac Lab 3.0.0,
``isaaclab_assets/robots/cartpole.py`` and ``GroundPlaneCfg``). Isaac Lab honours the ``ISAACSIM_ASSET_ROOT``
environment variable (``isaaclab/utils/assets.py``), so a local folder with files at those paths replaces the
server. The cart-pole is the one newton ships (``newton/examples/assets/cartpole.usda``) with its second pole
removed and its joints renamed to the names the task's actions, observations and rewards use; the ground is a
bare collision plane. They are not NVIDIA's assets: dynamics differ (masses, limits), the interface is the same.
"""

from __future__ import annotations

from pathlib import Path

ROBOT = "Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd"
GROUND = "Isaac/IsaacLab/Environments/Grid/default_ground_plane_checker_v1/default_ground_plane.usda"


def write_cartpole_assets(root: Path) -> Path:
    """Write the two stand-in files under ``root``; returns ``root`` (the value for ISAACSIM_ASSET_ROOT)."""
    import newton
    from pxr import Sdf, Usd, UsdGeom, UsdPhysics

    layer = Sdf.Layer.OpenAsAnonymous(str(Path(newton.__file__).parent / "examples/assets/cartpole.usda"))
    edit = Sdf.BatchNamespaceEdit()
    edit.Add("/cartPole/pole2", Sdf.Path.emptyPath)
    edit.Add("/cartPole/polePoleJoint", Sdf.Path.emptyPath)
    edit.Add("/cartPole/railCartJoint", "/cartPole/slider_to_cart")
    edit.Add("/cartPole/cartPoleJoint", "/cartPole/cart_to_pole")
    if not layer.Apply(edit):
        raise RuntimeError("newton's cartpole.usda changed: the stand-in cart-pole could not be derived from it")
    (root / ROBOT).parent.mkdir(parents=True, exist_ok=True)
    layer.Export(str(root / ROBOT), args={"format": "usda"})

    (root / GROUND).parent.mkdir(parents=True, exist_ok=True)
    stage = Usd.Stage.CreateNew(str(root / GROUND))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    stage.SetDefaultPrim(UsdGeom.Xform.Define(stage, "/GroundPlane").GetPrim())
    plane = UsdGeom.Plane.Define(stage, "/GroundPlane/CollisionPlane")  # spawn_ground_plane binds its material here
    plane.CreateAxisAttr(UsdGeom.Tokens.z)
    plane.CreateWidthAttr(100.0)
    plane.CreateLengthAttr(100.0)
    UsdPhysics.CollisionAPI.Apply(plane.GetPrim())
    stage.GetRootLayer().Save()
    return root
