"""SmolLM2-135M-Instruct on CPU, tool-use SPADE: the laptop config of `spade.game_type=tool_use`.

The games laptop config (smollm2_135m.py) with the six tool-use skills (the default of
`spade.skills` for this game type), room for a tool call's JSON in the Agent's answer and turns
for a few calls. SmolLM2's chat template has no tool support, so the Agent reads the tools and the
`<tool_call>` format in the first observation, and tool results come back as user turns
(docs/DESIGN.md §4.3). The LLM self-validation pass stays off, as on every laptop config: a 135M
model's verdict would be noise, and its 16k-token budget dominates a CPU cycle.
"""

from spade_jax.config import load_config_file


def get_config():
    c = load_config_file("smollm2_135m")
    c.spade.game_type = "tool_use"
    c.spade.self_validation = False  # the base default; on in configs/30b_tool_use.py
    c.spade.max_turns = 6  # a few dependent calls, then the answer
    c.sampling.agent_max_new_tokens = 96  # one <tool_call> with its JSON arguments
    c.sampling.designer_max_new_tokens = 1024  # tool schemas make the code longer than a game's
    return c
