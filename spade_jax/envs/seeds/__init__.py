"""Our own seed environments, shipped as data.

Each ``<skill_snake>_<name>.py`` (tool use: ``tool_use_<name>.py``) in this folder is the source of
one environment under the contract (docs/DESIGN.md §4.3). The host never imports them: it reads
them as text and runs them in the sandbox (tool-use ones there find ``ToolUseEnv`` as a global).
They seed the environment memory, form the fixed-environment training pool and serve as the
Designer's worked examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spade_jax.envs import skills

SKILLS = tuple(skills.GAME_SKILLS)  # the skills of the games
TOOL_USE_SKILLS = tuple(skills.TOOL_USE_SKILLS)  # of the tool-use seeds (the reference's six)

_SKILL_RE = re.compile(r"^Skill:\s*([A-Za-z_-]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class SeedEnv:
    name: str          # file stem, e.g. "logical_deduction_knights_knaves"
    skill: str         # one of SKILLS, or of TOOL_USE_SKILLS for a tool-use seed
    path: Path
    code: str
    is_tool_use: bool


def _skill_of(code: str, path: Path) -> str:
    m = _SKILL_RE.search(code)
    if m is None:
        raise ValueError(f"{path.name}: the module docstring has no 'Skill: <Name>' line")
    return m.group(1)


def list_seed_envs(skill: str | None = None, tool_use: bool | None = None) -> list[SeedEnv]:
    """All seed environments, sorted by name; optionally only one skill or tool-use kind."""
    out = []
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        if path.name.startswith("_"):
            continue
        code = path.read_text(encoding="utf-8")
        env = SeedEnv(name=path.stem, skill=_skill_of(code, path), path=path, code=code,
                      is_tool_use=path.stem.startswith("tool_use_"))
        if skill is not None and env.skill != skill:
            continue
        if tool_use is not None and env.is_tool_use != tool_use:
            continue
        out.append(env)
    return out


__all__ = ["SKILLS", "TOOL_USE_SKILLS", "SeedEnv", "list_seed_envs"]
