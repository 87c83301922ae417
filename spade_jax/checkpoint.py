"""Checkpoints: device state (params, optimizer) and host data (HostState, history) together.

A thin wrapper over orbax's CheckpointManager. Saves are atomic (orbax writes to a temporary
directory and commits by rename), so a run killed mid-save keeps its previous checkpoint. Restore
takes abstract target arrays that carry the *current* mesh's shardings, so a checkpoint written
on one topology restores on another. Every process calls save and restore; host data is the same
JSON on every process.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from spade_jax.errors import CheckpointError, MissingFileError
from spade_jax.workdir import absolute_path

FORMAT_VERSION = 1


class Checkpointer:
    """Save and restore (device_state, host_data) pairs under `<workdir>/checkpoints`.

    `workdir` is a local path or a `gs://` URI (orbax writes both through epath/tensorstore).
    """

    def __init__(self, workdir: str, *, keep: int = 3):
        self.directory = str(absolute_path(workdir) / "checkpoints")
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The newest fully written checkpoint step, or None when there is none."""
        return self._manager.latest_step()

    def save(self, step: int, device_state: Any, host_data: dict) -> None:
        """Write a checkpoint and wait for it; the previous one survives any failure here."""
        host = dict(host_data, format_version=FORMAT_VERSION)
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(device_state), host=ocp.args.JsonSave(host)
                ),
                force=True,
            )
            self._manager.wait_until_finished()
        except (OSError, ValueError) as err:  # a full disk: ValueError("RESOURCE_EXHAUSTED ...")
            raise CheckpointError(
                f"could not write checkpoint {step} under {self.directory}: {err}. "
                f"The previous checkpoint ({self._previous(step)}) is intact."
            ) from err

    def _previous(self, step: int) -> str:
        older = [s for s in self._manager.all_steps() if s < step]
        return f"step {max(older)}" if older else "none"

    def restore(self, step: int, target_state: Any) -> tuple[Any, dict]:
        """Restore `step` onto the shardings of `target_state` (arrays or ShapeDtypeStructs)."""
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target_state
        )
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()
                ),
            )
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise CheckpointError(
                f"checkpoint {step} in {self.directory} does not match this run's model/optimizer "
                f"({type(err).__name__}: {err}). Use a fresh --workdir or the config it was "
                "written with."
            ) from err
        host = dict(restored.host)
        version = host.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {step} has host-data format {version}, this code reads "
                f"{FORMAT_VERSION}"
            )
        logging.info("restored checkpoint %d from %s", step, self.directory)
        return restored.state, host

    def close(self) -> None:
        self._manager.close()


def checkpoint_location(path: str | os.PathLike) -> tuple[epath.Path, int | None]:
    """(training workdir, step or None for its newest) of a workdir or its `checkpoints/<step>`
    directory, local or `gs://`; a MissingFileError when `path` is neither."""
    path = absolute_path(os.path.expanduser(os.fspath(path)))
    if path.parent.name == "checkpoints" and path.name.isdigit():
        if not path.is_dir():
            raise MissingFileError(f"no checkpoint directory {path}")
        return path.parent.parent, int(path.name)
    if not (path / "checkpoints").is_dir():
        raise MissingFileError(f"no checkpoints under {path}: pass a training workdir or its "
                               "checkpoints/<step> directory")
    return path, None


def restore_state(workdir: str | os.PathLike, step: int | None,
                  target_state: Any) -> tuple[Any, int]:
    """(device state, step) of checkpoint `step` of `workdir` (None: its newest complete one),
    restored onto the shardings of `target_state`."""
    checkpointer = Checkpointer(os.fspath(workdir))
    try:
        step = checkpointer.latest_step() if step is None else step
        if step is None:
            raise MissingFileError(f"no complete checkpoint in {checkpointer.directory}")
        state, _ = checkpointer.restore(step, target_state)
    finally:
        checkpointer.close()
    return state, step
