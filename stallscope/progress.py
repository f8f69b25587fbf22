"""A minimal progress line on stderr, shown only when a person is watching."""

from __future__ import annotations

import json
import sys
import threading
import time

LINE_LIMIT = 120  # longest line _draw writes: bar, counts, a 60-character label, the time


class Progress:
    """Callable ``(label, done, total)``; silent unless stdout and stderr are terminals.

    While enabled, a background thread redraws the line twice a second so the
    elapsed time keeps moving during a long parse of a single file.
    """

    def __init__(self, enabled: bool | None = None, *, jsonl: bool = False):
        if enabled is None:
            enabled = jsonl or (sys.stderr.isatty() and sys.stdout.isatty())
        self.enabled = enabled
        self.jsonl = (
            jsonl  # one ``{"progress": [label, done, total]}`` line per update, for a parent
        )
        self.started = time.monotonic()
        self._width = 0
        self._state = ("", 0, 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.jsonl:
            sys.stderr.write(json.dumps({"progress": [label, done, total]}) + "\n")
            sys.stderr.flush()
            return
        self._state = (label, done, total)
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        self._draw()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._draw()

    def _draw(self) -> None:
        label, done, total = self._state
        filled = int(20 * done / total) if total else 20
        bar = "#" * filled + "-" * (20 - filled)
        text = f"\r[{bar}] {done}/{total} {label[:60]} ({time.monotonic() - self.started:.1f}s)"
        with self._lock:
            if self._stop.is_set() and self._width == -1:
                return
            self._width = max(self._width, len(text))
            sys.stderr.write(text.ljust(self._width))
            sys.stderr.flush()

    def clear_line(self) -> None:
        """Blank a progress line another process drew on this terminal (a killed worker's)."""
        if self.enabled and not self.jsonl:
            with self._lock:
                sys.stderr.write("\r" + " " * LINE_LIMIT + "\r")
                sys.stderr.flush()

    def done(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1)
        if self.enabled and self._width > 0:
            with self._lock:
                sys.stderr.write("\r" + " " * self._width + "\r")
                sys.stderr.flush()
                self._width = -1
