"""Workdir paths: one API (`etils.epath`) for local directories and `gs://` buckets.

Every file a run writes (checkpoints, metrics.jsonl, TensorBoard events, environment files,
config.json, eval outputs, the compilation cache) goes through these helpers, so a pod run can
keep its workdir in a bucket that every host sees and a preempted slice resumes from. GCS
objects can be neither appended to nor renamed atomically: `open_append` rewrites the whole
object on each flush, and `write_text_atomic` relies on an object upload being atomic itself.
Local paths behave as plain files do (append mode, write-then-rename).
"""

from __future__ import annotations

import io
import os
import tempfile

from etils import epath

from spade_jax.errors import WorkdirError

REMOTE_PREFIXES = ("gs://",)


def is_remote(path: str | os.PathLike) -> bool:
    """True for a bucket URI (`gs://...`), False for a local path."""
    return os.fspath(path).startswith(REMOTE_PREFIXES)


def absolute_path(path: str | os.PathLike) -> epath.Path:
    """`path` made absolute (orbax wants that); a `gs://` URI is absolute already.

    (`epath.Path("gs://b").absolute()` would prefix the current directory, which is the bug
    that made checkpoints land in `<cwd>/gs:/bucket/run`.)
    """
    if is_remote(path):
        return epath.Path(path)
    return epath.Path(os.path.abspath(os.fspath(path)))


def check_writable(directory: str | os.PathLike) -> None:
    """Raise a WorkdirError now, before minutes of model loading, if a local output `directory`
    cannot be written: its nearest existing ancestor takes a scratch directory, which is removed
    at once (so nothing is left behind). A bucket is checked when the run first writes to it."""
    if is_remote(directory):
        return
    path = os.path.abspath(os.fspath(directory))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise WorkdirError(f"{path}: {existing} is a file, not a directory")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as err:
        raise WorkdirError(f"{path} cannot be written under {existing}: "
                           f"{err.strerror or err}; pass a writable directory") from err


def write_text_atomic(path: epath.Path, text: str) -> None:
    """Write `text` to `path` so that a reader never sees half of it.

    Local: a `.tmp` sibling renamed over `path`. Bucket: one object upload, which GCS commits
    atomically (a rename there would be a copy and a delete).
    """
    path = epath.Path(path)
    if is_remote(path):
        path.write_text(text, encoding="utf-8")
        return
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class _RewritingAppender:
    """An append-mode file on a bucket: keeps the object's text and re-uploads all on flush."""

    def __init__(self, path: epath.Path, binary: bool):
        self._path = path
        self._binary = binary
        existing = path.read_bytes() if path.exists() else b""
        self._buffer = io.BytesIO(existing)
        self._buffer.seek(0, io.SEEK_END)
        self._dirty = False

    def write(self, data) -> int:
        self._buffer.write(data if self._binary else data.encode("utf-8"))
        self._dirty = True
        return len(data)

    def flush(self) -> None:
        if self._dirty:
            self._path.write_bytes(self._buffer.getvalue())
            self._dirty = False

    def close(self) -> None:
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def open_append(path: str | os.PathLike, *, binary: bool = False):
    """A file-like object appending to `path` (write / flush / close, a context manager).

    Local: the file opened in append mode, as `open` gives it. Bucket: what was written so far
    is uploaded as the whole object on every `flush` and on `close` (GCS has no append).
    """
    path = epath.Path(path)
    if is_remote(path):
        return _RewritingAppender(path, binary)
    if binary:
        return open(path, "ab")  # noqa: SIM115 (the caller closes it)
    return open(path, "a", encoding="utf-8")  # noqa: SIM115


COMPILE_CACHE_SUBDIR = "compile_cache"
_CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits",
                 "/jax/compilation_cache/cache_misses": "misses"}


def compile_cache_dir(workdir: str, setting: str | None) -> str | None:
    """Where the persistent compilation cache lives: `<workdir>/compile_cache` when `setting`
    is None, `setting` itself otherwise, and nowhere (None) when it is the empty string."""
    if setting is None:
        return str(epath.Path(workdir) / COMPILE_CACHE_SUBDIR)
    return setting or None


class CompileCacheCounter:
    """Counts JAX's persistent-cache hits and misses (its monitoring events) since creation."""

    def __init__(self):
        self.counts = {"hits": 0, "misses": 0}
        import jax

        jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **kwargs) -> None:
        if event in _CACHE_EVENTS:
            self.counts[_CACHE_EVENTS[event]] += 1


def enable_compilation_cache(directory: str) -> CompileCacheCounter:
    """Point JAX's persistent compilation cache at `directory` (local or gs://); a counter.

    A restarted or resumed run (and every host of a pod) then loads the compiled sampler and
    train step instead of compiling them again, which takes minutes for a large model. JAX
    opens the cache at the first compilation after the directory is set, so this may be called
    after programs were compiled (loading the model).
    """
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    return CompileCacheCounter()
