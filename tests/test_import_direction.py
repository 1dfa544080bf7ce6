"""Imports point one way (DESIGN.md §2): policies <- robot_rl <- sim, real.

robot_rl (outside robot_rl/cli) never imports sim, real or mujoco, and lerobot only in robot_rl/cli and robot_rl/data
(the dataset writer uses LeRobot's own dataset API, DESIGN.md §3 "Episodes"); policies (the bottom layer: what ships to
the robot, key names included) never imports robot_rl, sim or real; sim never imports real.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


RULES = [  # (package, modules it may not import, folders exempt)
    ("robot_rl", {"sim", "real", "mujoco"}, ("robot_rl/cli",)),
    ("robot_rl", {"lerobot"}, ("robot_rl/cli", "robot_rl/data")),
    ("policies", {"robot_rl", "sim", "real", "mujoco", "lerobot"}, ()),
    ("sim", {"real", "lerobot"}, ()),
]


@pytest.mark.parametrize("package,forbidden,exempt", RULES)
def test_import_direction(package, forbidden, exempt):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(folder + "/") for folder in exempt):
            continue
        hit = _imports(path) & forbidden
        if hit:
            bad.append(f"{rel} imports {sorted(hit)}")
    assert not bad, "imports against the dependency rule:\n" + "\n".join(bad)


def test_the_rule_is_checked_on_real_files():
    assert len(list((ROOT / "robot_rl").rglob("*.py"))) > 3
    assert "torch" in _imports(ROOT / "robot_rl" / "env.py")
