"""`frozen_heap`: the heap before a batch is frozen while it runs, and only then."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from rlm_graph.batch.heap import YOUNG_THRESHOLD
from rlm_graph.executors import frozen_heap


class Node:
    """A cycle: node.me is node."""

    def __init__(self) -> None:
        self.me = self


def test_the_heap_is_frozen_inside_and_given_back_after() -> None:
    assert gc.get_freeze_count() == 0
    old = Node()  # made before the batch, dropped during it
    gone = weakref.ref(old)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        del old
        gc.collect()
        assert gone() is not None  # frozen: no collection walks it
        new = Node()  # made during the batch: collected as usual
        new_gone = weakref.ref(new)
        del new
        gc.collect()
        assert new_gone() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gone() is None  # given back: collected after the batch


def test_overlapping_batches_unfreeze_when_the_last_one_ends() -> None:
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[int] = []

    def other_batch() -> None:
        first_in.wait()
        with frozen_heap():
            seen.append(gc.get_freeze_count())
        second_done.set()

    thread = threading.Thread(target=other_batch)
    thread.start()
    with frozen_heap():
        first_in.set()
        second_done.wait()
        assert gc.get_freeze_count() > 0  # the other batch ended; this one still runs
    thread.join()
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_program_that_froze_its_heap_keeps_it_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with frozen_heap():
            pass
        # Never unfrozen (that would be 0); a frozen object freed meanwhile leaves it.
        assert frozen > 0 and gc.get_freeze_count() > frozen - 1_000
    finally:
        gc.unfreeze()


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The program's garbage-collector thresholds, put back after the test."""
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def test_young_objects_are_collected_less_often_inside_and_as_before_after(
    thresholds: tuple[int, int, int],
) -> None:
    gc.set_threshold(700, 10, 10)
    with frozen_heap():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        with frozen_heap():  # an overlapping batch changes nothing
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("young", [0, YOUNG_THRESHOLD, 50_000])
def test_a_program_s_own_young_threshold_is_kept(
    thresholds: tuple[int, int, int], young: int
) -> None:
    """0 (automatic collection off) stays off; a threshold as high or higher stays."""
    gc.set_threshold(young, 10, 10)
    with frozen_heap():
        assert gc.get_threshold() == (young, 10, 10)
    assert gc.get_threshold() == (young, 10, 10)


def test_thresholds_the_program_changed_during_a_batch_are_not_undone(
    thresholds: tuple[int, int, int],
) -> None:
    gc.set_threshold(700, 10, 10)
    with frozen_heap():
        gc.set_threshold(5_000, 20, 20)
    assert gc.get_threshold() == (5_000, 20, 20)
