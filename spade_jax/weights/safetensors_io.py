"""Hugging Face safetensors checkpoints: import into sharded arrays, export back for HF / vLLM.

Import reads `config.json` into a ModelConfig and each device's slice of every tensor straight
from the (possibly multi-file) safetensors checkpoint, so a 30B model never exists whole in
host memory. Export writes `config.json` plus `model*.safetensors` (sharded with an index past
`max_shard_bytes`) one layer at a time, and the tokenizer files when a tokenizer is given,
to a local directory or a `gs://` one; `transformers.AutoModelForCausalLM.from_pretrained`
loads the result.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import Mesh
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save, save_file

from spade_jax.distributed import to_host
from spade_jax.errors import CheckpointError, MissingFileError
from spade_jax.models.config import ModelConfig
from spade_jax.models.transformer import Transformer
from spade_jax.weights.hf_config import hf_config_dict, model_config_from_hf, read_config_json
from spade_jax.weights.hf_layout import leaf_layouts
from spade_jax.weights.loading import load_model
from spade_jax.workdir import absolute_path, is_remote

INDEX_NAME = "model.safetensors.index.json"


class SafetensorsSource:
    """A `TensorSource` over the safetensors files of an HF checkpoint directory."""

    def __init__(self, directory: Path):
        directory = Path(directory)
        index = directory / INDEX_NAME
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in directory.glob("*.safetensors"))
        if not files:
            raise MissingFileError(
                f"no *.safetensors files in {directory}; spade_jax reads safetensors "
                "checkpoints (convert .bin/.pth ones with transformers' save_pretrained)"
            )
        self._handles = {}
        self._file_of: dict[str, str] = {}
        for name in files:
            path = directory / name
            if not path.is_file():
                raise MissingFileError(f"{path} is listed in {INDEX_NAME} but missing")
            try:
                handle = safe_open(str(path), framework="np")
            except SafetensorError as err:
                raise CheckpointError(f"{path} is not a readable safetensors file: {err}") from err
            self._handles[name] = handle
            self._file_of.update(dict.fromkeys(handle.keys(), name))

    def keys(self) -> set[str]:
        return set(self._file_of)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[key]].get_slice(key).get_shape())

    def read(self, key: str, slices: tuple[slice, ...]) -> np.ndarray:
        return self._handles[self._file_of[key]].get_slice(key)[slices]


def load_hf_config(directory: str | Path) -> ModelConfig:
    """The ModelConfig of an HF checkpoint directory (from its config.json)."""
    directory = Path(directory)
    return model_config_from_hf(read_config_json(directory), where=str(directory / "config.json"))


def load_hf_model(
    directory: str | Path, *, mesh: Mesh | None = None, param_dtype=jnp.float32,
    options: Mapping[str, Any] | None = None,
) -> Transformer:
    """Our Transformer with the weights of an HF safetensors directory, sharded on `mesh`;
    `options`: `ModelConfig`'s non-architecture fields to build it with (`MODEL_OPTIONS`)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingFileError(f"checkpoint directory {directory} does not exist")
    cfg = load_hf_config(directory).with_options(options)
    return load_model(
        cfg, SafetensorsSource(directory), mesh=mesh, param_dtype=param_dtype, where=str(directory)
    )


def _hf_tensors(model: Transformer, dtype):
    """Yield (HF key, numpy tensor) for every tensor of `model`, one layer at a time."""
    cfg = model.cfg
    layouts = leaf_layouts(cfg)
    unstacked = {name: lay for name, lay in layouts.items() if not lay.stacked}
    stacked = {name: lay for name, lay in layouts.items() if lay.stacked}
    for name, layout in unstacked.items():
        block = to_host(getattr(model, name)[...])
        yield layout.hf_key, layout.to_hf(block).astype(dtype)
    for layer in range(cfg.n_layers):
        for name, layout in stacked.items():
            block = to_host(getattr(model, name)[layer])
            fields = {"layer": layer}
            if layout.stacked == ("layer",):
                yield layout.hf_key.format(**fields), layout.to_hf(block).astype(dtype)
                continue
            for expert in range(cfg.n_experts):
                key = layout.hf_key.format(expert=expert, **fields)
                yield key, layout.to_hf(block[expert]).astype(dtype)


def save_hf(
    model: Transformer,
    directory: str | Path,
    *,
    tokenizer=None,
    dtype=None,
    max_shard_bytes: int = 4 << 30,
) -> epath.Path:
    """Write `model` as an HF checkpoint directory (config.json, safetensors, tokenizer),
    local or `gs://` (each file one object upload).

    Every process must call this (gathering is collective); only process 0 writes. `dtype`
    defaults to the parameter dtype (e.g. bfloat16 to serve a 30B policy with vLLM).
    """
    directory = absolute_path(directory)
    dtype = np.dtype(dtype if dtype is not None else model.embed[...].dtype)
    writer = jax.process_index() == 0
    if writer:
        directory.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    weight_map: dict[str, int] = {}
    for key, tensor in _hf_tensors(model, dtype):
        if shard_bytes and shard_bytes + tensor.nbytes > max_shard_bytes:
            if writer:
                _write_shard(directory, shards[-1], len(shards))
            shards.append({})
            shard_bytes = 0
        shards[-1][key] = np.ascontiguousarray(tensor)
        shard_bytes += tensor.nbytes
        weight_map[key] = len(shards)
    if not writer:
        return directory
    total = len(shards)
    if total == 1:
        _save_tensors(directory / "model.safetensors", shards[0])
    else:
        _write_shard(directory, shards[-1], total)
        names = {i: f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)}
        for i, name in names.items():
            (directory / f"tmp-{i:05d}.safetensors").rename(directory / name)
        index = {"metadata": {}, "weight_map": {k: names[i] for k, i in weight_map.items()}}
        (directory / INDEX_NAME).write_text(json.dumps(index, indent=2))
    hf = hf_config_dict(model.cfg, torch_dtype=str(dtype))
    if tokenizer is not None:
        hf.update(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        _save_tokenizer(tokenizer, directory)
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    return directory


def _save_tensors(path: epath.Path, tensors: dict[str, np.ndarray]) -> None:
    """One safetensors file: streamed to a local path, or uploaded whole to a bucket."""
    if is_remote(path):
        path.write_bytes(save(tensors, metadata={"format": "pt"}))
    else:
        save_file(tensors, str(path), metadata={"format": "pt"})


def _write_shard(directory: epath.Path, tensors: dict[str, np.ndarray], number: int) -> None:
    _save_tensors(directory / f"tmp-{number:05d}.safetensors", tensors)
    tensors.clear()


def _save_tokenizer(tokenizer, directory: epath.Path) -> None:
    """The tokenizer's files in `directory` (`save_pretrained` writes local files only)."""
    if not is_remote(directory):
        tokenizer.save_pretrained(str(directory))
        return
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        for path in sorted(Path(scratch).iterdir()):
            (directory / path.name).write_bytes(path.read_bytes())
