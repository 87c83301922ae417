"""What a run leaves in its workdir besides checkpoints: every environment as a `.py` file.

Every Designer attempt of a cycle is `envs/cycle_XXXXX/s<slot>_a<attempt>_<skill>.py`, the code
exactly as validated (or as generated, for rejected attempts, under `rejected/`), next to a
`.json` of the same name with its skill, `doc_id`, validity and failed checks (check,
message). Every environment played that cycle gets `played_<env_id>.json`: its skill, hint
and play statistics. Only process 0 writes.
"""

from __future__ import annotations

import json

from etils import epath

from spade_jax.workdir import write_text_atomic


class Artifacts:
    """Writer of per-cycle environment files under `<workdir>/envs`."""

    def __init__(self, workdir: str, *, enabled: bool = True):
        self.root = epath.Path(workdir) / "envs"
        self.enabled = enabled

    def write_cycle(self, cycle: int, attempts, plays) -> None:
        """Write generated attempts (valid and rejected) and the stats of every env played."""
        if not self.enabled:
            return
        folder = self.root / f"cycle_{cycle:05d}"
        (folder / "rejected").mkdir(parents=True, exist_ok=True)
        stats_by_id = {p.env.env_id: p.stats.to_dict() for p in plays}
        for a in attempts:
            name = f"s{a.slot:03d}_a{a.attempt}_{a.skill.lower()}"
            target = folder if a.valid else folder / "rejected"
            code = a.report.code if a.report.code else a.completion.text
            write_text_atomic(target / (name + ".py"), code)
            write_text_atomic(target / (name + ".json"), json.dumps({
                "skill": a.skill, "doc_id": a.doc_id, "valid": a.valid,
                "failures": [list(f) for f in a.report.failures],
            }, indent=1))
        for env in (p.env for p in plays):
            write_text_atomic(folder / f"played_{_safe(env.env_id)}.json", json.dumps({
                "env_id": env.env_id, "skill": env.skill, "hint": env.hint,
                "stats": stats_by_id.get(env.env_id),
            }, indent=1))


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)
