"""Inventory audit: query a warehouse catalogue and add up stock that matches a condition.

Skill: Data_Retrieval
Tools: list_items(category) and get_item(sku). ToolUseEnv is provided by the host.
"""
import json

CATEGORIES = {
    "tools": ["hammer", "wrench", "drill", "saw", "pliers", "level", "chisel"],
    "garden": ["hose", "rake", "shovel", "trowel", "planter", "sprinkler", "shears"],
    "kitchen": ["kettle", "skillet", "ladle", "whisk", "grater", "colander", "teapot"],
}


class InventoryAuditEnv(ToolUseEnv):  # noqa: F821 - ToolUseEnv is injected by the host
    def reset(self, seed=None):
        rng = self.rng
        items = {}
        for cat, names in CATEGORIES.items():
            for name in rng.sample(names, rng.randint(4, 5)):
                sku = f"{cat[:3].upper()}-{rng.randint(100, 999)}"
                while sku in items:
                    sku = f"{cat[:3].upper()}-{rng.randint(100, 999)}"
                items[sku] = {"name": name, "category": cat,
                              "price": rng.randint(5, 60), "stock": rng.randint(0, 40)}
        self.category = rng.choice(sorted(CATEGORIES))
        self.limit = rng.randint(20, 45)
        self._state = {"items": items}
        self._expected_answer = sum(it["stock"] for it in items.values()
                                    if it["category"] == self.category
                                    and it["price"] < self.limit)
        self._tools = {
            "list_items": {"description": "List the SKUs and names in a category.",
                           "parameters": {"type": "object", "properties": {
                               "category": {"type": "string"}}, "required": ["category"]}},
            "get_item": {"description": "Price and units in stock of one SKU.",
                         "parameters": {"type": "object", "properties": {
                             "sku": {"type": "string"}}, "required": ["sku"]}},
        }
        task = (f"Warehouse audit: how many units are in stock, in total, of items in the "
                f"'{self.category}' category whose price is strictly below ${self.limit}? "
                f"Categories: {', '.join(sorted(CATEGORIES))}. Answer with an integer.")
        return self.task_observation(task), {}

    def tool_list_items(self, category):
        cat = str(category).strip().lower()
        if cat not in CATEGORIES:
            return f"No category '{cat}'. Categories: {', '.join(sorted(CATEGORIES))}."
        rows = [f"{sku}: {it['name']}" for sku, it in sorted(self._state["items"].items())
                if it["category"] == cat]
        return "; ".join(rows)

    def tool_get_item(self, sku):
        it = self._state["items"].get(str(sku).strip().upper())
        if it is None:
            return f"No item with SKU '{sku}'."
        return f"{it['name']}: price ${it['price']}, in stock {it['stock']}"

    def solution(self):
        def call(name, **args):
            return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
        out = call("list_items", category=self.category)
        for sku, it in sorted(self._state["items"].items()):
            if it["category"] == self.category:
                out += call("get_item", sku=sku)
        return out + f"<answer>{self._expected_answer}</answer>"

    def hint(self):
        return ("List the requested category first, then look up every SKU in it; an item "
                "priced exactly at the limit does not count, and items with zero stock add "
                "nothing.")
