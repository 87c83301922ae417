"""SmolLM2-135M-Instruct on CPU, tool-use SPADE: the laptop config of `spade.game_type=tool_use`.

The games laptop config (smollm2_135m.py) with the six tool-use skills, room for a tool call's
JSON in the Agent's answer and turns for a few calls. SmolLM2's chat template has no tool
support, so the Agent reads the tools and the `<tool_call>` format in the first observation
(docs/DESIGN.md §4.3). The LLM self-validation pass is not implemented here (issue 22, point 3).
"""

from spade_jax.config import load_config_file
from spade_jax.envs.skills import TOOL_USE_SKILLS


def get_config():
    c = load_config_file("smollm2_135m")
    c.spade.game_type = "tool_use"
    c.spade.skills = tuple(TOOL_USE_SKILLS)
    c.spade.max_turns = 6  # a few dependent calls, then the answer
    c.sampling.agent_max_new_tokens = 96  # one <tool_call> with its JSON arguments
    c.sampling.designer_max_new_tokens = 1024  # tool schemas make the code longer than a game's
    return c
