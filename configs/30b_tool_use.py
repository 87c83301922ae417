"""Qwen3-30B-A3B-Instruct-2507 on tool-use environments: the paper's tool-use run.

Reference `cmd/tool_use/train_spade_30b.sh` (`_train_spade_blend.sh` with TOOL_MODEL_SIZE=30b):
the model and mesh of configs/30b.py with the tool-use deltas below; everything else is the
reference default of `base_config` (docs/reference_parity.md).
"""

from pathlib import Path

from spade_jax.config import load_config_file


def get_config():
    c = load_config_file(Path(__file__).with_name("30b.py"))  # same model, mesh and dtypes
    c.spade.game_type = "tool_use"  # and its 6 skills (the default of spade.skills)
    c.spade.self_validation = True  # --spade-use-env-validator (the training model judges)
    c.spade.regen_interval = 8  # REGEN_INTERVAL default 8
    c.spade.designer_delay = 8  # PROPOSER_DELAY default 8
    c.spade.compact_filter = True  # --spade-compact-filter
    c.sampling.hint_max_new_tokens = 2048  # HINT_MAX_TOKENS default 2048
    c.corpus.max_words = 4000  # --spade-corpus-max-doc-tokens 4000
    c.train.kl_coef = 0.005  # --kl-loss-coef 0.005
    return c
