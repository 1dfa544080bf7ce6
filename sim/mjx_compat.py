"""Adapting a MuJoCo model to what MJX's JAX implementation supports (``make_mjx_compatible``).

Kept apart from the backend (``sim/mjx.py``) because the agreement tests hand the adapted model to both backends,
and because it needs no JAX compilation: the checks read MJX's own collision table.
"""

from __future__ import annotations

import logging

import mujoco
import numpy as np

log = logging.getLogger(__name__)


def make_mjx_compatible(model: mujoco.MjModel) -> list[str]:
    """Adapt ``model`` in place to what MJX's JAX implementation supports; returns what was changed.

    * Solver: MJX has no PGS; PGS becomes Newton (few iterations for small nv, what MJX recommends on GPUs).
    * Collision pairs without an MJX collision function (cylinder-box, as of mujoco-mjx 3.17): the cylinder
      collides as the box that bounds it (same pose, half-sizes r, r, h). Same for both backends when the caller
      also hands this model to ``mujoco`` (the agreement tests do).
    * Frictionless contacts (condim 1) under elliptic cones, which MJX does not implement: condim 3 (the pair's
      own friction then applies).
    * Contact sensors MJX cannot compute (site, body or subtree matching, net-force reduction): a clear error
      naming the sensor; geom-geom contact sensors are supported.
    """
    from mujoco.mjx._src import collision_driver  # the pair list MJX itself will check in put_model

    changes = []
    if model.opt.solver == mujoco.mjtSolver.mjSOL_PGS:
        model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        changes.append("solver PGS -> Newton")
    cyl = int(mujoco.mjtGeom.mjGEOM_CYLINDER)
    to_box = set()
    for g1, g2, _ in collision_driver.geom_pairs(model):
        t1, t2 = model.geom_type[[g1, g2]]
        if not collision_driver.has_collision_fn(t1, t2):
            cyls = [g for g, t in ((g1, t1), (g2, t2)) if t == cyl]
            if not cyls:
                raise NotImplementedError(
                    f"MJX has no collision function for geoms {_geom_label(model, g1)} ({mujoco.mjtGeom(t1).name}) "
                    f"and {_geom_label(model, g2)} ({mujoco.mjtGeom(t2).name}); change one of their types or "
                    "exclude the pair (contype/conaffinity)")
            to_box.update(cyls)
    for g in sorted(to_box):
        r, h = model.geom_size[g, :2]
        model.geom_type[g] = mujoco.mjtGeom.mjGEOM_BOX
        model.geom_size[g] = (r, r, h)
        model.geom_rbound[g] = float(np.sqrt(2 * r * r + h * h))
        model.geom_aabb[g] = (0.0, 0.0, 0.0, r, r, h)
        changes.append(f"collision cylinder {_geom_label(model, g)} -> its bounding box")
    if model.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC:
        for p in range(model.npair):
            if model.pair_dim[p] == 1:
                model.pair_dim[p] = 3
                changes.append(f"contact pair {_geom_label(model, model.pair_geom1[p])}-"
                               f"{_geom_label(model, model.pair_geom2[p])}: condim 1 -> 3 (elliptic cones)")
        for g in range(model.ngeom):
            if model.geom_condim[g] == 1 and (model.geom_contype[g] or model.geom_conaffinity[g]):
                model.geom_condim[g] = 3
                changes.append(f"geom {_geom_label(model, g)}: condim 1 -> 3 (elliptic cones)")
    for i in range(model.nsensor):
        if model.sensor_type[i] != mujoco.mjtSensor.mjSENS_CONTACT:
            continue
        kinds = {int(model.sensor_objtype[i]), int(model.sensor_reftype[i])}
        bad = {int(mujoco.mjtObj.mjOBJ_SITE), int(mujoco.mjtObj.mjOBJ_BODY), int(mujoco.mjtObj.mjOBJ_XBODY)} & kinds
        if bad or model.sensor_intprm[i, 1] == 3:
            raise NotImplementedError(
                f"contact sensor {model.sensor(i).name!r} uses site/body/subtree matching or net-force reduction, "
                "which MJX cannot compute; match geoms against geoms instead")
    for c in changes:
        log.warning("mjx: %s", c)
    if model.opt.ls_iterations > 10 or model.opt.iterations > 20:
        # Under vmap MJX's line search runs all ls_iterations every solver iteration (a scan of conds turned into
        # selects), and float32 rarely meets MuJoCo's default tolerance: the cost is ~iterations x ls_iterations.
        log.warning("mjx: solver iterations=%d ls_iterations=%d make every MJX step expensive; MJX models usually "
                    "set <option iterations=\"4-10\" ls_iterations=\"4-10\">", model.opt.iterations,
                    model.opt.ls_iterations)
    return changes


def _geom_label(model: mujoco.MjModel, g: int) -> str:
    name = model.geom(g).name
    return repr(name) if name else f"#{g} of body {model.body(model.geom_bodyid[g]).name!r}"

