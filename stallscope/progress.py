"""A minimal progress line on stderr, shown only when a person is watching."""

from __future__ import annotations

import sys
import time


class Progress:
    """Callable ``(label, done, total)``; silent unless stdout and stderr are terminals."""

    def __init__(self, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty() and sys.stdout.isatty()
        self.enabled = enabled
        self.started = time.monotonic()
        self._width = 0

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        filled = int(20 * done / total) if total else 20
        bar = "#" * filled + "-" * (20 - filled)
        text = f"\r[{bar}] {done}/{total} {label[:60]} ({time.monotonic() - self.started:.1f}s)"
        self._width = max(self._width, len(text))
        sys.stderr.write(text.ljust(self._width))
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self._width:
            sys.stderr.write("\r" + " " * self._width + "\r")
            sys.stderr.flush()
