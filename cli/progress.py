"""Progress for a long command: a rich bar on a terminal; without one (a log, CI) a plain
line at most every PLAIN_S, and none for a command done sooner, so a log holds no control
codes and no blank line a bar would leave."""

from __future__ import annotations

import time
from typing import Callable

from shmcache.cli.stop import STOP

PLAIN_S = 2.0


class ProgressLine:
    """`with ProgressLine(console, columns, total, **fields) as p: p.update(plain, **kw)`:
    `columns` (rich progress columns) and `fields` make the bar; `update` moves it with `kw`
    (completed=, total=, fields) on a terminal, else prints `plain()` when one is due."""

    def __init__(self, console, columns: tuple, total: float, **fields):
        from rich.progress import Progress

        self.console, self.last = console, time.monotonic()
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(*columns, console=console, transient=True)
            self.task = self.bar.add_task("", total=total, **fields)

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()

    def update(self, plain: Callable[[], str], **kw) -> None:
        STOP.check()  # a stop asked while a finalizer ran: raised again here, at a step of the work
        if self.bar is not None:
            self.bar.update(self.task, **kw)
            return
        now = time.monotonic()
        if now - self.last >= PLAIN_S:
            self.last = now
            # one line whatever its length (a console without a terminal is 80 columns wide),
            # its text as it is (no markup, no highlighting)
            self.console.print(plain(), soft_wrap=True, markup=False, highlight=False)
