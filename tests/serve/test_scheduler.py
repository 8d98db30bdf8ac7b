"""Iteration-level scheduling with a fake model: who joins when, limits, early answers,
cancellation, stop."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

import pytest
from conftest import wait_until

from attn_mt.serve.batcher import QueueFull
from attn_mt.serve.scheduler import Scheduler


@dataclass(frozen=True)
class Event:
    tag: object
    kind: str
    value: object


class Fake:
    """A running batch whose items are (name, steps): each sentence ends after that many steps."""

    def __init__(self, key, log: list, fail: bool = False, pause: float = 0.002, hold=None) -> None:
        self.key, self.log, self.fail, self.pause, self.left, self.names = (
            key, log, fail, pause, {}, {})
        self.hold = hold  # called with the log before each step: a test stops the worker there

    def __len__(self) -> int:
        return len(self.left)

    def add(self, items):
        self.log.append(("add", self.key, [name for _, (name, _) in items]))
        for tag, (name, steps) in items:
            self.left[tag], self.names[tag] = steps, name

    def step(self):
        if self.hold:
            self.hold(self.log)
        time.sleep(self.pause)  # the model's time
        if self.fail:
            raise RuntimeError("model failed")
        self.log.append(("step", self.key, sorted(self.names[t] for t in self.left)))
        events = []
        for tag in list(self.left):
            self.left[tag] -= 1
            events.append(Event(tag, "token", self.left[tag]))
            if not self.left[tag]:
                del self.left[tag]
                events.append(Event(tag, "done", self.names[tag]))
        return events

    def drop(self, tags):
        self.log.append(("drop", self.key, sorted(self.names[t] for t in tags)))
        for tag in tags:
            self.left.pop(tag, None)


def scheduler(log, run_one=lambda item: item, bad=(), hold=None, **kw) -> Scheduler:
    return Scheduler(lambda key: Fake(key, log, fail=key in bad, hold=hold), run_one, **kw)


class Pause:
    """A Fake's hold: the worker stops before the first step at which `when(log)` holds, until `go`
    is set; the test acts meanwhile: `p = Pause(lambda log: ...); scheduler(log, hold=p);
    p.paused.wait(30)`."""

    def __init__(self, when) -> None:
        self.when, self.paused, self.go = when, threading.Event(), threading.Event()

    def __call__(self, log: list) -> None:
        if not self.go.is_set() and self.when(log):
            self.paused.set()
            assert self.go.wait(30)


def steps_of(log, name):
    return [i for i, (what, _, names) in enumerate(log) if what == "step" and name in names]


def test_a_newcomer_joins_at_the_next_free_row_before_the_rest_of_a_huge_request():
    log = []
    pause = Pause(lambda log: len([e for e in log if e[0] == "step"]) >= 3)
    s = scheduler(log, max_batch=4, hold=pause)
    huge = s.submit("k", [(f"h{i}", 5) for i in range(40)])
    assert pause.paused.wait(30)  # three steps done, the fourth waits
    small = s.submit("k", [("small", 2)])
    pause.go.set()
    assert small.result(30) == ["small"] and huge.result(30) == [f"h{i}" for i in range(40)]
    # never more than max_batch
    assert max(len(names) for what, _, names in log if what == "step") == 4
    joined = next(i for i, (what, _, names) in enumerate(log) if what == "add" and "small" in names)
    adds_before = [names for what, _, names in log[:joined] if what == "add"]
    # it joined when the first rows came free (the huge one's first 4)
    assert sum(map(len, adds_before)) <= 4 + 1
    # answered while the huge one was running
    assert steps_of(log, "small")[-1] < steps_of(log, "h4")[0] + 5


def test_a_sentence_that_ends_early_is_answered_at_once():
    log, done_when = [], {}
    s = scheduler(log)
    long = s.submit("k", [("long", 40)])
    short = s.submit("k", [("short", 2)])
    short.add_done_callback(lambda f: done_when.setdefault("short", long.done()))
    assert short.result(30) == ["short"] and long.result(30) == ["long"]
    assert done_when["short"] is False  # answered while the long one was still decoding
    assert len(steps_of(log, "short")) == 2


def test_rows_and_work_are_bounded_and_a_larger_sentence_runs_alone():
    log = []
    s = scheduler(log, max_batch=3, max_batch_work=25)
    jobs = ([s.submit("k", [(f"a{i}", 3)], costs=[10]) for i in range(5)]
            + [s.submit("k", [("big", 3)], costs=[40])])
    assert [j.result(30) for j in jobs][-1] == ["big"]
    live = [names for what, _, names in log if what == "step"]
    assert max(map(len, live)) == 2  # 2 x 10 units fit in 25, a third does not
    assert all(names == ["big"] for names in live if "big" in names)


def test_a_job_whose_client_left_leaves_the_running_batch_at_the_next_step():
    log = []
    pause = Pause(lambda log: len(steps_of(log, "g0")) >= 3)
    s = scheduler(log, hold=pause)
    gone = s.submit("k", [("g0", 1000), ("g1", 1000)])
    stay = s.submit("k", [("stay", 60)])
    assert pause.paused.wait(30)  # three steps done, the fourth waits
    gone.cancel()
    pause.go.set()
    assert stay.result(30) == ["stay"]
    dropped = next(i for i, e in enumerate(log) if e[0] == "drop")
    assert log[dropped][2] == ["g0", "g1"]
    assert len([i for i in steps_of(log, "g0") if i > dropped]) == 0
    assert len(steps_of(log, "g0")) < 30  # it ran a few steps, not a thousand


def test_settings_take_turns_and_attention_jobs_run_between_steps():
    log = []

    def run_one(item):
        log.append(("one", None, [item]))
        return item

    s = scheduler(log, run_one=run_one, join_every=1)
    a = s.submit("a", [("a", 6)])
    b = s.submit("b", [("b", 6)])
    m = s.submit(None, ["map"])
    assert a.result(30) == ["a"] and b.result(30) == ["b"] and m.result(30) == "map"
    stepped = [key for what, key, _ in log if what == "step"]
    # b joined at once or one step later
    assert stepped[:4] in (["a", "b", "a", "b"], ["a", "a", "b", "a"])
    one = log.index(("one", None, ["map"]))
    assert one < steps_of(log, "a")[-1]  # the map ran while a was still decoding, not after


def test_watch_gets_progress_then_the_result():
    log, seen = [], []
    s = scheduler(log)
    f = s.submit("k", [("x", 3), ("y", 1)], watch=lambda i, kind,
                 value: seen.append((i, kind, value)))
    assert f.result(30) == ["x", "y"]
    assert [e for e in seen if e[0] == 0] == [(0, "token", 2), (0, "token", 1), (0, "token", 0),
                                              (0, "done", "x")]
    assert (1, "done", "y") in seen


def test_a_failed_step_fails_its_jobs_only_and_the_worker_goes_on():
    log = []
    s = scheduler(log, bad={"bad"})
    bad, good = s.submit("bad", [("b", 3)]), s.submit("good", [("g", 3)])
    with pytest.raises(RuntimeError, match="model failed"):
        bad.result(30)
    assert good.result(30) == ["g"] and s.submit("good", [("again", 2)]).result(30) == ["again"]


def test_the_queue_is_bounded_and_stop_fails_the_waiting_and_the_running():
    log = []
    s = scheduler(log, max_batch=1, max_queue=2)
    running = s.submit("k", [("r", 10_000)])
    waiting = s.submit("k", [("w", 1)])
    with pytest.raises(QueueFull):
        s.submit("k", [("one too many", 1)])
    wait_until(lambda: steps_of(log, "r"), what="the first step")
    start = time.monotonic()
    s.close()
    for f in (running, waiting):
        with pytest.raises(Exception, match="shutting down"):
            f.result(30)
    # not the 10_000 steps (20 s) of r
    assert time.monotonic() - start < 5 and not s._thread.is_alive()
    assert not any(what == "add" and "w" in names for what, _, names in log)


def test_a_watcher_that_fails_is_dropped_and_the_worker_goes_on():
    log = []
    s = scheduler(log)

    def broken(i, kind, value):
        raise RuntimeError("event loop is closed")

    assert s.submit("k", [("x", 3)], watch=broken).result(30) == ["x"]  # answered all the same
    assert s.submit("k", [("y", 2)]).result(30) == ["y"] and s._thread.is_alive()


def test_newcomers_join_a_running_batch_every_join_every_steps_and_an_empty_one_at_once():
    log = []
    steps = threading.Semaphore(0)  # the worker takes one per step: the test lets it step
    s = scheduler(log, join_every=3, hold=lambda log: steps.acquire(timeout=30))
    steps.release(2)
    assert s.submit("k", [("alone", 2)]).result(30) == ["alone"]
    assert log[0] == ("add", "k", ["alone"])  # an empty batch: joined at once
    long = s.submit("k", [("long", 60)])
    for i in range(12):  # newcomers arriving while the long one decodes: one step between two
        s.submit("k", [(f"n{i}", 2)])
        done = len([e for e in log if e[0] == "step"])
        steps.release()
        wait_until(lambda done=done: len([e for e in log if e[0] == "step"]) > done, what="a step")
    steps.release(1000)
    assert long.result(30) == ["long"]
    steps_before = [sum(1 for e in log[:i] if e[0] == "step") for i, e in enumerate(log)
                    if e[0] == "add"]
    gaps = [b - a for a, b in itertools.pairwise(steps_before[1:])]
    assert gaps and min(gaps) >= 3  # joins while decoding are 3 steps apart
    # so newcomers joined together
    assert max(len(names) for what, _, names in log if what == "add") >= 2
