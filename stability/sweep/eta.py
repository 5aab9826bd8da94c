"""The time a sweep has left: the cost model, corrected online from this sweep's finished runs.

``schedule`` orders jobs by a relative cost (epochs x precision factor x accumulation
factor). Its precision factors were measured on one kind of CPU; on another the ratios differ
(fp16 ~6x fp32 on one 2-core VM, less on another), so an ETA that only scales the model by the
pace so far is off by the model's error: 2.5x on the default study on an Intel VM
(docs/sweeps.md, "ETA"). ``Eta`` therefore measures seconds per unit of modelled cost for
every kind of job (``schedule.cost_key``: task, precision, accum) from the runs of this sweep
that ended, and predicts each job left with the rate of its own kind, else of its precision,
else of everything measured so far. The first job of each worker also paid for starting it
(imports, the first MLflow and SQLite work: 40 s of a 50 s run on a loaded 2-core VM), so
those are used only while nothing else speaks for a kind. The time left is then what a pool of
``workers`` takes for the jobs still running (their expected rest) and the queue in launch
order, each job taken by the first free worker (``stability.sweep.pool``'s rule).

``schedule.with_probes`` starts one job of each kind early, so every kind is measured within
the first few percent of a sweep.
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from collections.abc import Sequence

from stability.sweep.schedule import CostKey


class Eta:
    """Seconds left in a sweep, from job costs and the durations of jobs that ended.

    Args:
        kinds: each job's ``cost_key``, in launch order.
        costs: each job's modelled cost (relative units), in launch order.
        workers: jobs that run at once (the pool's worker count; 1 when serial).
    """

    def __init__(self, kinds: Sequence[CostKey], costs: Sequence[float], workers: int) -> None:
        if len(kinds) != len(costs):
            raise ValueError("one kind per cost")
        self.kinds = list(kinds)
        self.costs = [max(float(c), 1e-9) for c in costs]
        self.workers = max(1, workers)
        self.started: dict[int, float] = {}  # job -> start time (s), while it runs
        self.ended: set[int] = set()
        self._starts: list[float] = []  # every start seen (the first ``workers``: warm-up)
        self._ratios: dict[CostKey, list[float]] = defaultdict(list)  # seconds per unit
        self._warm: dict[CostKey, list[float]] = defaultdict(list)  # of workers' first jobs

    def start(self, job: int, at: float) -> None:
        """Job ``job`` started at ``at`` (seconds on the caller's clock)."""
        if job not in self.ended and job not in self.started:
            self.started[job] = at
            self._starts.append(at)

    def end(self, job: int, at: float, duration: float | None = None) -> None:
        """Job ``job`` ended at ``at``; it ran ``duration`` seconds (default: since its start).

        A job without a known start or duration is counted as done but measures nothing.
        """
        start = self.started.pop(job, None)
        self.ended.add(job)
        if duration is None and start is not None:
            duration = at - start
        if duration is not None and duration > 0:
            # A worker's first job started before any other job ended: among the first starts.
            warm = start is not None and sum(t < start for t in self._starts) < self.workers
            (self._warm if warm else self._ratios)[self.kinds[job]].append(
                duration / self.costs[job])

    def rate(self, kind: CostKey) -> float | None:
        """Seconds per unit of modelled cost for ``kind``: its own runs, else those of the
        same task and precision, else every run measured so far (None before the first);
        workers' first jobs only where no other job tells."""
        for ratios in (self._ratios, self._warm):
            own = ratios.get(kind)
            if own:
                return statistics.median(own)
            same = [r for k, rs in ratios.items() if k[:2] == kind[:2] for r in rs]
            if same:
                return statistics.median(same)
            every = [r for rs in ratios.values() for r in rs]
            if every:
                return statistics.median(every)
        return None

    def expected(self, job: int) -> float | None:
        """Expected seconds of ``job`` (None before any job ended)."""
        rate = self.rate(self.kinds[job])
        return None if rate is None else rate * self.costs[job]

    def remaining(self, now: float) -> float | None:
        """Seconds until the last job ends: the running jobs' expected rest, then the queue
        in launch order, each job taken by the first free worker (None before any job ended)."""
        if not self._ratios and not self._warm:
            return None
        free = []
        for job, start in self.started.items():
            exp = self.expected(job)
            assert exp is not None
            free.append(max(exp - (now - start), 0.0))
        free += [0.0] * max(0, self.workers - len(free))
        heapq.heapify(free)
        for job in range(len(self.kinds)):
            if job in self.ended or job in self.started:
                continue
            exp = self.expected(job)
            assert exp is not None
            heapq.heappush(free, heapq.heappop(free) + exp)
        return max(free)
