"""The emulator's controllable clock: wall time plus an offset, or frozen at one instant."""

from __future__ import annotations

import threading
import time


class Clock:
    """Unix seconds as the emulator sees them; tests move it with ``set``/``advance``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset_s = 0.0
        self._frozen_at: float | None = None

    def now(self) -> int:
        """The current emulator time, whole unix seconds (Stripe's resolution)."""
        return int(self.now_float())

    def now_float(self) -> float:
        with self._lock:
            if self._frozen_at is not None:
                return self._frozen_at
            return time.time() + self._offset_s

    def set(self, now: float, *, frozen: bool = False) -> None:
        """Jump to ``now``; time keeps ticking from there unless ``frozen``."""
        with self._lock:
            self._offset_s = now - time.time()
            self._frozen_at = now if frozen else None

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset_s += seconds
            if self._frozen_at is not None:
                self._frozen_at += seconds

    def reset(self) -> None:
        with self._lock:
            self._offset_s = 0.0
            self._frozen_at = None

    def describe(self) -> dict[str, object]:
        return {
            "now": self.now(),
            "offset_s": self._offset_s,
            "frozen": self._frozen_at is not None,
        }
