"""A tiny statistical profiler: samples every thread's Python stack from a side thread.

Used by `bench/ours.py --profile` to find where an engine's time goes. (cProfile hooks
the interpreter and, on this machine, left a ``trio.run`` of a completion spinning
without finishing; sampling from outside changes nothing in the code under test.)

    with Sampler(interval=0.0005) as sampler:
        run_something()
    print(sampler.report(top=30))

``report`` lists functions by *self* samples (the frame on top of the stack) and by
*inclusive* samples (the function anywhere on the stack, counted once per sample), per
thread group: the trio thread (``MainThread``) and worker threads together. A thread
waiting (epoll, a lock, an idle worker) is counted as idle, not as a cost. Sampling takes
the GIL, so the figures are shares of busy time, roughly, not exact times; set
``active = False`` to skip what should not be measured.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from types import FrameType

__all__ = ["Sampler"]

# Functions on top of a stack that mean "waiting", not "working".
IDLE = frozenset(
    {"get_events", "wait", "_work", "_send_message_to_trio", "select", "poll", "acquire"}
)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    filename = code.co_filename
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{code.co_name}"


class Sampler:
    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.self_counts: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.samples: collections.Counter[str] = collections.Counter()
        self.idle: collections.Counter[str] = collections.Counter()
        self.active = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._stop.is_set():
            if not self.active:
                time.sleep(self.interval)
                continue
            frames = sys._current_frames()
            for ident, frame in frames.items():
                if ident == me:
                    continue
                if ident not in names:
                    thread = next((t for t in threading.enumerate() if t.ident == ident), None)
                    names[ident] = "main" if thread is threading.main_thread() else "workers"
                group = names[ident]
                if frame.f_code.co_name in IDLE:
                    self.idle[group] += 1
                    continue
                self.samples[group] += 1
                self.self_counts[group][_where(frame)] += 1
                seen = set()
                f: FrameType | None = frame
                while f is not None:
                    where = _where(f)
                    if where not in seen:
                        seen.add(where)
                        self.inclusive[group][where] += 1
                    f = f.f_back
            time.sleep(self.interval)

    def __enter__(self) -> Sampler:
        # With the default 5 ms switch interval the sampler would only get the GIL when
        # the measured thread releases it (a syscall), and every sample would land there.
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(self.interval / 4)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def report(self, top: int = 25) -> str:
        lines = []
        for group in ("main", "workers"):
            total = self.samples[group]
            if not total:
                lines.append(f"== thread: {group}: idle ({self.idle[group]} samples) ==")
                continue
            lines.append(f"== thread: {group}, {total} busy samples, {self.idle[group]} idle ==")
            lines.append("-- self --")
            for where, n in self.self_counts[group].most_common(top):
                lines.append(f"{100 * n / total:6.1f}%  {where}")
            lines.append("-- inclusive --")
            for where, n in self.inclusive[group].most_common(top):
                lines.append(f"{100 * n / total:6.1f}%  {where}")
        return "\n".join(lines)
