"""The SPADE self-play loop: Designer, hints, Agent plays, regret rewards, memory, runtime."""
