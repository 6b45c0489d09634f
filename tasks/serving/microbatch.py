"""A micro-batcher: concurrent requests joined into one model call.

Callers :meth:`MicroBatcher.submit` a request (a list of items) and wait on the returned future.
One worker thread takes the first waiting request, then keeps taking requests until the batch
holds ``max_batch`` items or ``max_wait_ms`` has passed since the first was taken, and calls
``run(requests)`` once for all of them. Invariants:

* a request is never split across two ``run`` calls (what answers it answers all of it), so a
  request larger than ``max_batch`` runs alone;
* ``run`` is only ever called from the one worker thread (calls are serialised: the model needs
  no lock);
* ``run`` returns one result per request, in order; an exception it raises fails every request
  of that batch, and the worker goes on with the next.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger("hydra_ens")

T = TypeVar("T")
R = TypeVar("R")
_STOP = None  # what close() queues


@dataclass
class BatchStats:
    """Counters since start (read without a lock: each is one int, written by the worker)."""

    requests: int = 0
    items: int = 0
    batches: int = 0
    largest_batch: int = 0


@dataclass
class _Pending(Generic[T, R]):
    items: list[T]
    future: Future[R] = field(default_factory=Future)


class MicroBatcher(Generic[T, R]):
    """Joins concurrent requests into batches of at most ``max_batch`` items (see module doc).

    Args:
        run: ``run(requests) -> results``: ``requests`` is a list of item lists, the result list
            has one entry per request.
        max_batch: items per ``run`` call (>= 1); a bigger request runs alone.
        max_wait_ms: how long the first request of a batch waits for others (>= 0).
    """

    def __init__(
        self,
        run: Callable[[list[list[T]]], Sequence[R]],
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self._run, self.max_batch, self.max_wait_s = run, max_batch, max_wait_ms / 1000
        self._queue: queue.Queue[_Pending[T, R] | None] = queue.Queue()
        self._held: list[_Pending[T, R] | None] = []  # taken, did not fit the last batch
        self.stats = BatchStats()
        self._thread = threading.Thread(target=self._loop, name="microbatcher", daemon=True)
        self._thread.start()

    def submit(self, items: Sequence[T]) -> Future[R]:
        """Queue one request; its future resolves to ``run``'s result for it."""
        if not self._thread.is_alive():
            raise RuntimeError("the micro-batcher is stopped")
        pending: _Pending[T, R] = _Pending(list(items))
        self._queue.put(pending)
        return pending.future

    def close(self, timeout: float = 5.0) -> None:
        """Answer what is queued, then stop the worker."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _next_batch(self) -> list[_Pending[T, R]] | None:
        first = self._held.pop() if self._held else self._queue.get()
        if first is _STOP:
            return None
        batch, size = [first], len(first.items)
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_batch:
            left = deadline - time.monotonic()
            try:
                nxt = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP or size + len(nxt.items) > self.max_batch:
                self._held.append(nxt)  # the stop mark, or the first request of the next batch
                break
            batch.append(nxt)
            size += len(nxt.items)
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            live = [p for p in batch if p.future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = list(self._run([p.items for p in live]))
                if len(results) != len(live):
                    raise RuntimeError(f"run returned {len(results)} results for {len(live)}")
            except Exception as err:  # every request of the batch gets the error
                for p in live:
                    p.future.set_exception(err)
            else:
                for p, result in zip(live, results, strict=True):
                    p.future.set_result(result)
            items = sum(len(p.items) for p in live)
            self.stats.requests += len(live)
            self.stats.items += items
            self.stats.batches += 1
            self.stats.largest_batch = max(self.stats.largest_batch, items)
