"""The MLflow call ``Sender``: order, bounded retries and going offline, on a fake clock.

No server and no real waiting: the sender's ``clock`` and ``sleep`` are a fake clock that
``sleep`` advances, so the retry bound is checked in the sender's own time.
"""

from __future__ import annotations

from stability.tracking.buffer import BACKOFF_FIRST_S, Sender


class FakeTime:
    """A monotonic clock that only ``sleep`` moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_sender_rides_out_a_passing_failure_in_order() -> None:
    """Three refused attempts are retried with back-off; every call arrives, in order."""
    fake = FakeTime()
    delivered: list[int] = []
    failures = iter([ConnectionError("refused")] * 3)

    def flaky(i: int) -> None:
        err = next(failures, None)
        if err is not None:
            raise err
        delivered.append(i)

    sender = Sender(retry_s=30, clock=fake.clock, sleep=fake.sleep)
    for i in range(5):
        sender.submit(lambda i=i: flaky(i), f"call {i}")
    assert sender.close() and delivered == [0, 1, 2, 3, 4] and sender.retries == 3
    assert not sender.offline and sender.lost == 0
    # Exponential back-off with jitter: half to full of 0.5 s, 1 s, 2 s (+10 ms).
    assert len(fake.sleeps) == 3
    for attempt, slept in enumerate(fake.sleeps):
        full = BACKOFF_FIRST_S * 2 ** attempt
        assert full / 2 + 0.01 <= slept <= full + 0.01


def test_sender_gives_up_within_its_bound_and_drops_later_calls() -> None:
    """An outage longer than retry_s: offline after retry_s of its time, later calls lost."""
    fake = FakeTime()
    tried: list[int] = []

    def down(i: int) -> None:
        tried.append(i)
        raise ConnectionError("refused")

    sender = Sender(retry_s=1.0, clock=fake.clock, sleep=fake.sleep)
    for i in range(3):
        sender.submit(lambda i=i: down(i), f"call {i}")
    assert not sender.close()
    assert sender.offline and sender.lost == 3
    # Only the first call rode the outage (1..3 back-offs, never past the 1 s bound + 10 ms
    # per sleep); the later ones were dropped at once, without an attempt (the journal
    # keeps them).
    assert set(tried) == {0} and 1 <= sender.retries == len(fake.sleeps) <= 3
    assert 1.0 <= fake.now <= 1.0 + 0.01 * len(fake.sleeps)
