"""Pencil shop: compute a shop's revenue with calculator tools.

Skill: Tool_Selection
Easy: three calculator calls, then the answer. ToolUseEnv is provided by the host.
"""
import json

INT2 = {"type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}


class PencilShopEnv(ToolUseEnv):  # noqa: F821 - ToolUseEnv is injected by the host
    def reset(self, seed=None):
        rng = self.rng
        self.packs, self.per_pack = rng.randint(12, 49), rng.randint(12, 36)
        self.broken, self.price = rng.randint(5, 40), rng.randint(3, 9)
        self._tools = {
            "multiply": {"description": "Return a * b.", "parameters": INT2},
            "subtract": {"description": "Return a - b.", "parameters": INT2},
            "add": {"description": "Return a + b.", "parameters": INT2},
        }
        self._state = {"calls": 0}
        self._expected_answer = (self.packs * self.per_pack - self.broken) * self.price
        task = (f"A shop received {self.packs} packs of {self.per_pack} pencils. "
                f"{self.broken} pencils were broken and thrown away. Every other pencil was sold "
                f"for ${self.price}. How many dollars did the shop take in? Use the calculator "
                "tools; answer with a plain integer.")
        return self.task_observation(task), {}

    def _nums(self, a, b):
        self._state["calls"] += 1
        return int(a), int(b)

    def tool_multiply(self, a, b):
        a, b = self._nums(a, b)
        return str(a * b)

    def tool_subtract(self, a, b):
        a, b = self._nums(a, b)
        return str(a - b)

    def tool_add(self, a, b):
        a, b = self._nums(a, b)
        return str(a + b)

    def solution(self):
        total = self.packs * self.per_pack
        calls = [("multiply", self.packs, self.per_pack), ("subtract", total, self.broken),
                 ("multiply", total - self.broken, self.price)]
        out = "".join("<tool_call>" + json.dumps({"name": n, "arguments": {"a": a, "b": b}})
                      + "</tool_call>" for n, a, b in calls)
        return out + f"<answer>{self._expected_answer}</answer>"

    def hint(self):
        return ("First find how many pencils arrived, remove the broken ones, and only then "
                "multiply by the price; let the tools do every multiplication.")
