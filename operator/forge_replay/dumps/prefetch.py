"""Load the next rollout's dump in a background thread while the current one trains."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Calls ``load(rollout_id)`` for ``rollout_ids`` in order, at most ``depth`` loads in flight ahead of the consumer.

    ``get(rollout_id)`` returns that rollout's item (re-raising the loader's error for it) and
    records how long the consumer waited for data: ``last_wait_seconds`` and ``wait_seconds``
    (total). Rollouts must be requested in the order given. Use as a context manager, or ``close()``.
    """

    def __init__(self, load: Callable[[int], T], rollout_ids: Iterable[int], depth: int = 1):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._load = load
        self._ids = list(rollout_ids)
        self._depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge-replay-prefetch")
        self._pending: dict[int, Future[T]] = {}
        self._next = 0  # position in _ids of the next rollout to schedule
        self._lock = threading.Lock()
        self.wait_seconds = 0.0
        self.last_wait_seconds = 0.0
        self.waits: list[float] = []
        self._closed = False
        self._schedule()

    def _schedule(self) -> None:
        while self._next < len(self._ids) and len(self._pending) < self._depth:
            rollout_id = self._ids[self._next]
            self._pending[rollout_id] = self._pool.submit(self._load, rollout_id)
            self._next += 1

    def scheduled(self, rollout_id: int) -> bool:
        """True when ``rollout_id`` is loading or loaded and not yet taken with :meth:`get`."""
        with self._lock:
            return not self._closed and rollout_id in self._pending

    def get(self, rollout_id: int) -> T:
        """The item for ``rollout_id``; blocks until loaded, then starts loading the following one."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Prefetcher is closed")
            future = self._pending.pop(rollout_id, None)
            if future is None:
                expected = sorted(self._pending) or "none left"
                raise KeyError(f"rollout {rollout_id} was not scheduled next (pending: {expected})")
        started = time.perf_counter()
        try:
            return future.result()
        finally:
            waited = time.perf_counter() - started
            self.last_wait_seconds = waited
            self.wait_seconds += waited
            self.waits.append(waited)
            with self._lock:
                if not self._closed:
                    self._schedule()

    def close(self) -> None:
        """Stop prefetching; pending loads are cancelled or left to finish in the background."""
        with self._lock:
            self._closed = True
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
