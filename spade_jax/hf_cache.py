"""HF Hub repositories read from the local `huggingface_hub` cache only (never the network)."""

from __future__ import annotations

import re
from pathlib import Path

from spade_jax.errors import MissingFileError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the HF Hub spells ids


def snapshot(repo_id: str, repo_type: str = "model") -> Path:
    """The directory of `repo_id` (a "model" or "dataset" repo) in the local Hugging Face cache;
    MissingFileError saying where it looked and how to fetch it when it is not there."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except LocalEntryNotFoundError as error:
        fetch = f"hf download {repo_id}" + (" --repo-type dataset" if repo_type == "dataset"
                                            else "")
        raise MissingFileError(
            f"HF Hub {repo_type} {repo_id!r} is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); fetch it first: {fetch}") from error
