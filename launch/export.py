"""Export a training checkpoint as a Hugging Face safetensors directory (config and tokenizer).

    python launch/export.py --checkpoint=runs/smollm2 --out=exported/smollm2
    python launch/export.py --checkpoint=runs/smollm2/checkpoints/3 --out=exported/c3
    python launch/export.py --checkpoint=runs/x --config=configs/tiny.py --out=exported/x

`--checkpoint` is a training workdir (its newest checkpoint is used) or one `checkpoints/N`
directory in it. The run's config is read from `<workdir>/config.json` (written by
`launch/train.py`) unless `--config` is given. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(out)` (and vLLM) and gives our logits.
Parameters are restored onto the first device; `--shard` restores onto the config's mesh over
every device instead (for models that do not fit one device; run it on every host).
"""

from __future__ import annotations

import json
import logging

from absl import flags
from etils import epath
from ml_collections import config_flags

from spade_jax.cli import run
from spade_jax.errors import MissingFileError
from spade_jax.workdir import check_writable

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "The run's configs/*.py (default: <workdir>/config.json).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A training workdir or its checkpoints/N directory.")
_OUT = flags.DEFINE_string("out", None, "Output directory for the HF checkpoint.")
_DTYPE = flags.DEFINE_string(
    "dtype", None, "Tensor dtype of the export (default: the run's param_dtype), e.g. bfloat16.")
_SHARD = flags.DEFINE_bool(
    "shard", False, "Restore onto the config's mesh over all devices instead of one device.")
flags.mark_flags_as_required(["checkpoint", "out"])


def read_run_config(workdir: epath.Path):
    """The run config a workdir (local or `gs://`) recorded in config.json, as a ConfigDict."""
    import ml_collections

    path = workdir / "config.json"
    if not path.is_file():
        raise MissingFileError(
            f"{path} does not exist (runs started before config.json was recorded); pass "
            "--config=configs/<the run's config>.py with the run's overrides")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def model_config_and_tokenizer(model):
    """The architecture the run's `model` record (a `PolicyConfig`) names and its tokenizer,
    as `Runtime` would load them."""
    from spade_jax.policy import named_path, resolve_model
    from spade_jax.weights.gguf import gguf_model_config, open_gguf
    from spade_jax.weights.safetensors_io import load_hf_config
    from spade_jax.weights.tokenizer import load_tokenizer

    if model.source == "random":
        return model.arch, load_tokenizer(named_path(model.tokenizer))
    source = resolve_model(model.source)
    if source.is_dir():
        model_cfg = load_hf_config(source)
    else:
        model_cfg = gguf_model_config(open_gguf(source), where=str(source))
    return model_cfg, load_tokenizer(source)


def export(checkpoint: str, out: str, cfg=None, *, dtype=None,
           shard: bool = False) -> epath.Path:
    """Restore a checkpoint's parameters and write them as an HF directory at `out`."""
    import flax.nnx as nnx
    import jax

    from spade_jax import config as config_lib
    from spade_jax.checkpoint import checkpoint_location, restore_state
    from spade_jax.readiness import abstract_train_state
    from spade_jax.rl.trainer import TrainConfig, make_optimizer
    from spade_jax.sharding import make_mesh
    from spade_jax.weights.safetensors_io import save_hf

    workdir, step = checkpoint_location(checkpoint)
    run = config_lib.parse(cfg if cfg is not None else read_run_config(workdir))
    model_cfg, tokenizer = model_config_and_tokenizer(run.model)
    if shard:
        mesh = make_mesh(run.mesh.shape(jax.device_count()))
    else:
        mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    optimizer = make_optimizer(TrainConfig())  # only the optimizer state's structure matters
    model, target = abstract_train_state(model_cfg, optimizer, mesh, run.model.param_dtype)
    state, step = restore_state(workdir, step, target)
    graphdef, _ = nnx.split(model)
    trained = nnx.merge(graphdef, state.params)
    directory = save_hf(trained, out, tokenizer=tokenizer, dtype=dtype)
    logging.info("exported checkpoint %d of %s to %s", step, workdir, directory)
    return directory


def main(argv):
    del argv
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    check_writable(_OUT.value)
    path = export(_CHECKPOINT.value, _OUT.value, _CONFIG.value, dtype=_DTYPE.value,
                  shard=_SHARD.value)
    print(f"wrote {path} ({', '.join(sorted(p.name for p in path.iterdir()))})")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run(main)
