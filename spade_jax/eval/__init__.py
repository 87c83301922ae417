"""Held-out evaluation: every benchmark is an environment under our contract (docs/DESIGN.md §7).

`suites.build_eval_tasks` gives the tasks per suite; `report` writes and compares results.
"""
