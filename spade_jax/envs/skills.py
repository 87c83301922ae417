"""The skills environments exercise, per game type: name -> one-line description.

The single source of skill names: the Designer's prompts and the config check read them through
`spade.prompts.GameType.skills`, the seed environments through `envs.seeds`. It lives with the
environments (not in `spade`) so that `envs` does not import `spade`.
"""

from __future__ import annotations

GAME_SKILLS = {
    "Mathematical_Reasoning": "computing with numbers, equations and quantities across "
    "several dependent steps",
    "Logical_Deduction": "drawing conclusions from premises, rules and constraints, ruling "
    "possibilities out one by one",
    "Spatial_Reasoning": "tracking positions, directions, paths and shapes on grids or maps",
    "Pattern_Recognition": "discovering the hidden rule behind sequences, codes or "
    "transformations and applying it",
    "Optimization": "finding the best plan under limits of budget, capacity, time or moves",
    "Causal_Inference": "finding which causes produce which effects by intervening and "
    "observing the results",
}

TOOL_USE_SKILLS = {
    "API_Orchestration": "chaining tool calls that change state one after another",
    "Data_Retrieval": "finding information with query tools, then acting on it exactly",
    "State_Modification": "a sequence of state changes, each depending on the state before",
    "Error_Recovery": "handling tool errors: checking state, correcting arguments, retrying",
    "Tool_Selection": "choosing the right tool among alternatives from the current state",
    # the reference's own spelling (its "Multi-Step Workflows", underscored as in its recipes)
    "Multi-Step_Workflows": "ordered workflows whose later steps need earlier results",
}
