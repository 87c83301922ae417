"""A simulated user played by a model, for benchmarks whose dialogues need one (ACEBench Agent).

An environment asks for the user's next message by returning `info["user_request"]` (the user
model's chat messages, `acebench_env.USER_REQUEST`) with a placeholder observation; its next `step`
action is then the user's reply, not the agent's. `SimulatedUserRunner` wraps the rollout's
env runner and answers every such request (all pending ones of a batch in one sampler call)
until each environment has something for the agent or has ended, so `rollout.play_episodes`
only ever sees agent turns. `ModelUser` plays the user with any sampler and chat format: the
evaluation's default is the policy's own; `load_user` (launch/eval.py --user_model) loads
another model for it. It answers greedily with up to ACEBench's 1000 tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from spade_jax.eval.acebench_env import USER_REQUEST
from spade_jax.seeding import derive_seed
from spade_jax.spade.rollout import Decoding

# ACEBench's user (APIUSER) samples at temperature 0.001 with max_tokens 1000: greedy here.
USER_DECODING = Decoding(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=1000)


class ModelUser:
    """Replies to user-simulator conversations with `sampler` (a `sampling.Sampler`)."""

    def __init__(self, sampler, chat, decoding: Decoding = USER_DECODING, seed: int = 0):
        self.sampler, self.chat, self.decoding, self.seed = sampler, chat, decoding, seed
        self.calls = 0

    def reply(self, conversations: Sequence[list[dict]]) -> list[str]:
        """The user's next message in each conversation (chat messages, system first)."""
        prompts = [self.chat.prompt(list(messages)) for messages in conversations]
        budget = self.decoding.max_new_tokens
        session = self.sampler.start(prompts, capacity=max(map(len, prompts)) + budget)
        self.calls += 1
        outputs = session.decode(budget, **self.decoding.decode_kwargs(),
                                 stop_token_ids=[self.chat.eos_id],
                                 seed=derive_seed(self.seed, "user", self.calls))
        return [self.chat.tokenizer.decode(output.tokens, skip_special_tokens=True)
                for output in outputs]


def load_user(run, mesh, source: str, seed: int = 0) -> ModelUser:
    """A `ModelUser` played by the model `source` (a name, HF directory or .gguf, as
    `config.model.source`) with the run's dtypes, on `mesh`."""
    import jax.numpy as jnp

    from spade_jax.sampling import Sampler
    from spade_jax.spade.rollout import ChatFormat
    from spade_jax.spade.runtime import load_model_and_tokenizer

    user_run = dataclasses.replace(run, model=dataclasses.replace(run.model, source=source))
    model, tokenizer = load_model_and_tokenizer(user_run, mesh)
    sampler = Sampler(model, mesh=mesh, compute_dtype=jnp.dtype(run.model.compute_dtype))
    return ModelUser(sampler, ChatFormat(tokenizer), seed=seed)


class SimulatedUserRunner:
    """An env runner whose environments' user requests are answered by `user` (`.reply`)."""

    def __init__(self, inner, user):
        self.inner, self.user = inner, user

    def reset_many(self, specs):
        """Start the episodes; one whose reset asks the user starts at the answer to it."""
        starts = self.inner.reset_many(specs)
        asking = [i for i, start in enumerate(starts) if start.ok and start.info.get(USER_REQUEST)]
        answered = self._answer([(starts[i].handle, starts[i].info) for i in asking])
        for i, result in zip(asking, answered, strict=True):
            if result.ok and not result.done:
                starts[i] = dataclasses.replace(starts[i], observation=result.observation,
                                                info=result.info)
            else:  # ended or failed while the user was speaking: nothing for the agent
                starts[i] = dataclasses.replace(
                    starts[i], ok=False, status=result.status if not result.ok else "ended",
                    error=result.error or "the episode ended before the agent's first turn")
        return starts

    def step_many(self, handles_and_actions):
        """Step with the agents' actions, then answer user requests until none is pending."""
        results = list(self.inner.step_many(handles_and_actions))
        asking = [i for i, r in enumerate(results) if self._asks(r)]
        answered = self._answer([(results[i].handle, results[i].info) for i in asking])
        for i, result in zip(asking, answered, strict=True):
            results[i] = result
        return results

    def close_many(self, handles) -> None:
        """Close the episodes."""
        self.inner.close_many(handles)

    def _answer(self, requests: list[tuple[int, dict]]) -> list:
        """Each handle's first step result that does not ask the user again."""
        final: dict[int, object] = {}
        pending = list(requests)
        while pending:
            replies = self.user.reply([info[USER_REQUEST] for _, info in pending])
            stepped = self.inner.step_many([(h, r) for (h, _), r in zip(pending, replies,
                                                                        strict=True)])
            pending = []
            for result in stepped:
                if self._asks(result):
                    pending.append((result.handle, result.info))
                else:
                    final[result.handle] = result
        return [final[handle] for handle, _ in requests]

    @staticmethod
    def _asks(result) -> bool:
        return result.ok and not result.done and isinstance(result.info, dict) \
            and bool(result.info.get(USER_REQUEST))
