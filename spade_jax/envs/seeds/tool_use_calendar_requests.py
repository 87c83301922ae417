"""Calendar requests: carry out two scheduling requests, one after the other, with tools.

Skill: State_Modification
A multi-message task: the second request appears once the first is done (message criteria).
ToolUseEnv is provided by the host.
"""
import json

DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
HOURS = list(range(9, 17))
TITLES = ["design review", "old sync", "lunch talk", "budget check", "1:1", "demo prep"]


class CalendarRequestsEnv(ToolUseEnv):  # noqa: F821 - ToolUseEnv is injected by the host
    def reset(self, seed=None):
        rng = self.rng
        self.day1, self.day2 = rng.sample(DAYS, 2)
        events, next_id = {}, 1
        for day in DAYS:
            for hour in sorted(rng.sample(HOURS, rng.randint(2, 5))):
                events[next_id] = {"day": day, "hour": hour, "title": rng.choice(TITLES[2:])}
                next_id += 1
        busy = sorted(e["hour"] for e in events.values() if e["day"] == self.day1)
        free = [h for h in HOURS if h not in busy]
        self.old_id = next_id
        events[next_id] = {"day": self.day1, "hour": rng.choice(free), "title": "old sync"}
        busy2 = {e["hour"] for e in events.values() if e["day"] == self.day2}
        if 9 not in busy2:   # make the earliest free slot non-obvious
            events[next_id + 1] = {"day": self.day2, "hour": 9, "title": "design review"}
            busy2.add(9)
        self.slot = min(h for h in HOURS if h not in busy2)
        self._state = {"events": events, "next_id": max(events) + 1}
        self._user_messages = [
            f"Please cancel the 'old sync' meeting on {self.day1}.",
            f"Now book a 'standup' at the earliest free hour on {self.day2}.",
        ]
        self._message_criteria = [
            lambda s: not any(e["title"] == "old sync" for e in s["events"].values()),
            lambda s: [e["hour"] for e in s["events"].values()
                       if e["day"] == self.day2 and e["title"] == "standup"] == [self.slot],
        ]
        day = {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]}
        self._tools = {
            "list_events": {"description": "List the events (id, hour, title) of a day.",
                            "parameters": day},
            "cancel_event": {"description": "Cancel an event by its id.",
                             "parameters": {"type": "object", "properties": {
                                 "event_id": {"type": "integer"}}, "required": ["event_id"]}},
            "book_event": {"description": "Book an event at an hour (9-16) of a day.",
                           "parameters": {"type": "object", "properties": {
                               "day": {"type": "string"}, "hour": {"type": "integer"},
                               "title": {"type": "string"}},
                               "required": ["day", "hour", "title"]}},
        }
        task = ("You manage a calendar (Monday-Friday, one-hour slots from 9 to 16). Requests "
                "arrive one at a time; the episode ends when all are done.\nUSER: "
                + self._user_messages[0])
        return self.task_observation(task), {}

    def tool_list_events(self, day):
        d = str(day).strip().lower()
        if d not in DAYS:
            raise ValueError(f"unknown day '{d}'")
        rows = [f"#{i} {e['hour']}:00 {e['title']}" for i, e in
                sorted(self._state["events"].items(), key=lambda kv: kv[1]["hour"])
                if e["day"] == d]
        return "; ".join(rows) if rows else "no events"

    def tool_cancel_event(self, event_id):
        ev = self._state["events"].pop(int(event_id), None)
        return f"Cancelled #{event_id}." if ev else f"No event #{event_id}."

    def tool_book_event(self, day, hour, title):
        d, h = str(day).strip().lower(), int(hour)
        if d not in DAYS or h not in HOURS:
            raise ValueError("day must be monday-friday and hour 9-16")
        if any(e["day"] == d and e["hour"] == h for e in self._state["events"].values()):
            return f"{d} {h}:00 is already taken."
        eid = self._state["next_id"]
        self._state["next_id"] += 1
        self._state["events"][eid] = {"day": d, "hour": h, "title": str(title).strip().lower()}
        return f"Booked #{eid}: {d} {h}:00 {title}."

    def solution(self):
        calls = [("list_events", {"day": self.day1}), ("cancel_event", {"event_id": self.old_id}),
                 ("list_events", {"day": self.day2}),
                 ("book_event", {"day": self.day2, "hour": self.slot, "title": "standup"})]
        return "".join("<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>"
                       for n, a in calls)

    def hint(self):
        return ("Look up the event ids with list_events before cancelling, and list the second "
                "day to see which hours are taken before booking; the earliest free hour may not "
                "be 9.")
