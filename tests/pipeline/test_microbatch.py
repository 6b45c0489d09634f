"""The micro-batcher of the prediction service (deterministic: a gate holds the worker while
requests queue), and the filter that keeps torch's CUDA_HOME notice out of CPU inference."""

from __future__ import annotations

import logging
import threading

import pytest

from tasks.serving.microbatch import MicroBatcher


class GatedRun:
    """``run`` that records each batch and, on its first call, waits until ``release``."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, requests: list[list[int]]) -> list[int]:
        self.batches.append(requests)
        self.entered.set()
        self.release.wait(30)
        return [sum(r) for r in requests]


def test_queued_requests_join_one_batch_up_to_max_batch_and_are_never_split():
    run = GatedRun()
    batcher = MicroBatcher(run, max_batch=4, max_wait_ms=0)
    try:
        first = batcher.submit([1])
        assert run.entered.wait(30)  # the worker is inside run with [[1]]
        waiting = [batcher.submit(r) for r in ([2, 3], [4], [5], [6, 7, 8, 9, 10], [11])]
        run.release.set()
        assert first.result(30) == 1
        assert [f.result(30) for f in waiting] == [5, 4, 5, 40, 11]
    finally:
        batcher.close()
    # [2, 3] + [4] + [5] fill 4 items; the 5-item request runs alone, whole; then [11]
    assert run.batches == [[[1]], [[2, 3], [4], [5]], [[6, 7, 8, 9, 10]], [[11]]]
    assert (batcher.stats.requests, batcher.stats.batches, batcher.stats.largest_batch) == (6, 4, 5)


def test_an_error_in_run_fails_its_batch_only_and_the_worker_goes_on():
    calls = []

    def run(requests):
        calls.append(requests)
        if len(calls) == 1:
            raise ValueError("bad batch")
        return [len(r) for r in requests]

    batcher = MicroBatcher(run, max_batch=2, max_wait_ms=0)
    try:
        with pytest.raises(ValueError, match="bad batch"):
            batcher.submit(["a"]).result(30)
        assert batcher.submit(["a", "b"]).result(30) == 2
    finally:
        batcher.close()
    with pytest.raises(RuntimeError, match="stopped"):
        batcher.submit(["a"])


@pytest.mark.parametrize(("max_batch", "max_wait_ms"), [(0, 1), (1, -1)])
def test_bad_settings_are_refused(max_batch, max_wait_ms):
    with pytest.raises(ValueError, match=r"max_batch must be|max_wait_ms must be"):
        MicroBatcher(lambda r: r, max_batch=max_batch, max_wait_ms=max_wait_ms)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_cuda_home_notice_is_dropped_and_nothing_else():
    import torch  # noqa: F401 - torch's logging set-up first (it stops propagation)

    from hydra_ops.compile.backends.export import quiet_cuda_home_notice

    logger = logging.getLogger("torch.utils.cpp_extension")
    quiet_cuda_home_notice()
    quiet_cuda_home_notice()  # once, however often called
    assert len(logger.filters) == len({type(f) for f in logger.filters})
    collect = Collect()
    logger.addHandler(collect)
    try:
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local")
        logger.warning("another warning")
    finally:
        logger.removeHandler(collect)
    assert collect.messages == ["another warning"]
