"""Saying what a long step waits for: a line on stderr once a step has taken more than a second, so a
silent terminal never leaves the user guessing whether clang, the verifier or a job's JIT is working."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PATIENCE_S = 1.0   # steps shorter than this pass in silence


class Progress:
    """Lines on stderr: notes always (clang's warnings), ``prefix: step ...`` only when ``steps`` is true;
    nothing at all when ``silent``."""

    def __init__(self, prefix: str, *, steps: bool, silent: bool = False, patience: float | None = None) -> None:
        self.prefix, self.steps, self.silent = prefix, steps, silent
        self.patience = PATIENCE_S if patience is None else patience
        self._lock = threading.Lock()

    @classmethod
    def quiet(cls) -> "Progress":
        return cls("", steps=False, silent=True)

    def say(self, text: str) -> None:
        """Print ``text`` as it is (several lines stay several lines)."""
        if not self.silent:
            with self._lock:
                print(text, file=sys.stderr, flush=True)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Run the block; if it is still running after ``patience`` seconds, say ``prefix: what ...``."""
        if not self.steps or self.silent:
            yield
            return
        timer = threading.Timer(self.patience, self.say, (f"{self.prefix}: {what} ...",))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
