"""Two or more "processes" as threads: `allgather_json` replaced by an exchange between them."""

import json
import threading


class Exchange:
    """allgather_json between threads: every rank gets every rank's value, in rank order."""

    def __init__(self, ranks: int):
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.slots = [None] * ranks

    def gather_for(self, rank: int):
        def gather(value):
            self.slots[rank] = json.loads(json.dumps(value))
            self.barrier.wait()
            values = list(self.slots)
            self.barrier.wait()
            return values
        return gather


def run_as_processes(ranks: int, work) -> list:
    """`work(rank, gather)` on `ranks` threads at once; their results in rank order.

    An exception on one rank aborts the exchange (releasing the others) and is re-raised.
    """
    exchange, results, errors = Exchange(ranks), [None] * ranks, []

    def host(rank):
        try:
            results[rank] = work(rank, exchange.gather_for(rank))
        except Exception as err:  # surfaced below, with the other threads released
            errors.append(err)
            exchange.barrier.abort()

    threads = [threading.Thread(target=host, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results
