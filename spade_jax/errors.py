"""Errors that tell the user what went wrong and what to do, instead of a deep JAX traceback."""

from __future__ import annotations


class SpadeError(Exception):
    """Base class of every error spade_jax raises on bad input."""


class ConfigError(SpadeError, ValueError):
    """A configuration value (mesh, topology, model shape) that cannot work."""


class CheckpointError(SpadeError, ValueError):
    """A checkpoint we cannot read or write: unsupported architecture, wrong shapes, unknown
    quantisation, a run's checkpoint that does not match its config, a failed (e.g. disk full)
    save."""


class WorkdirError(SpadeError, OSError):
    """A run directory that cannot be created or written."""


class MissingFileError(SpadeError, FileNotFoundError):
    """A file or directory the user pointed us at does not exist or lacks a required file."""
