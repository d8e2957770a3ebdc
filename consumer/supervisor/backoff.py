"""A worker slot's restart backoff: a worker that dies is restarted after a wait that
doubles with each death in a row (BACKOFF_FIRST_S, 2x, 4x ... up to BACKOFF_MAX_S), so a
worker that dies at once is not restarted ten times a second; the count of deaths in a
row goes back to zero once a worker has stayed up for BACKOFF_RESET_S."""

from __future__ import annotations

BACKOFF_FIRST_S = 0.5  # wait before restarting a worker that died after a good run
BACKOFF_MAX_S = 10.0  # the longest wait between two restarts
BACKOFF_RESET_S = 10.0  # up this long, a worker's deaths in a row count from zero again


def backoff_s(failures: int) -> float:
    """The wait before the restart that follows `failures` deaths in a row (failures >= 1)."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(max(failures - 1, 0), 32))


class RestartBackoff:
    """The restart policy of one worker slot, on the caller's clock (monotonic seconds):
    deaths in a row, when the next restart is due, and the reset after a long enough stay up."""

    def __init__(self):
        self.failures = 0  # deaths in a row, without a stay of BACKOFF_RESET_S up between them
        self.up_since = 0.0  # when the current instance came up
        self.restart_at = 0.0  # when the restart is due, after a death

    def up(self, now: float) -> None:
        """The worker came up (claimed its row)."""
        self.up_since = now

    def settle(self, now: float) -> bool:
        """The worker is still up: True if it has now stayed up long enough that its deaths in a
        row count from zero again (they were not zero before)."""
        if self.failures and now - self.up_since >= BACKOFF_RESET_S:
            self.failures = 0
            return True
        return False

    def died(self, now: float) -> float:
        """The worker died: count it, and return the wait before its restart (due at restart_at)."""
        self.failures += 1
        wait = backoff_s(self.failures)
        self.restart_at = now + wait
        return wait

    def due(self, now: float) -> bool:
        return now >= self.restart_at
