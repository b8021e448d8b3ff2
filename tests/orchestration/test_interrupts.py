"""Ctrl-C deferred past the run's record writes (``orchestration/interrupts.py``): a real
SIGINT sent to this process, inside and outside critical sections."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from kernelarc.orchestration.interrupts import DeferredInterrupt


def _press_ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(autouse=True)
def python_default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for each test, whatever the test run inherited (a shell
    starts background jobs with SIGINT ignored); the inherited one back afterwards."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_an_interrupt_waits_for_the_critical_section() -> None:
    guard = DeferredInterrupt()
    guard.install()
    try:
        done = []
        with pytest.raises(KeyboardInterrupt), guard.critical():
            _press_ctrl_c()
            with guard.critical():  # nested: still deferred
                done.append("inner")
            done.append("outer")
        assert done == ["inner", "outer"], "the section ran to its end first"
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    fresh = DeferredInterrupt()
    fresh.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            _press_ctrl_c()  # outside a section: at once
            for _ in range(1000):
                pass
    finally:
        fresh.uninstall()


def test_only_the_first_stop_signal_interrupts() -> None:
    """``timeout`` sends SIGTERM to its whole process group and a benchmark script passes
    it on to its search: the second signal must not cut the run's orderly stop."""
    inherited = signal.getsignal(signal.SIGTERM)
    guard = DeferredInterrupt()
    guard.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        _press_ctrl_c()
        for _ in range(1000):
            pass
        assert (guard.received, guard.count, guard.pending) == ("SIGTERM", 3, False)
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGTERM) is inherited


def test_a_section_left_by_an_error_keeps_the_interrupt_for_the_next_check() -> None:
    guard = DeferredInterrupt()
    guard.install()
    try:
        with pytest.raises(ValueError), guard.critical():
            _press_ctrl_c()
            raise ValueError("the write failed")
        assert guard.pending
        with pytest.raises(KeyboardInterrupt):
            guard.check()
        guard.check()  # raised once
    finally:
        guard.uninstall()


def test_an_ignored_sigint_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a job a shell started with `&`
    guard = DeferredInterrupt()
    guard.install()
    try:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with guard.critical():
            _press_ctrl_c()
        assert not guard.pending
        guard.check()  # nothing to raise
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_held_stretch_is_cut_only_inside_its_windows() -> None:
    """The run's end (``finish.py``): a signal between the windows waits and is raised on
    entering the next one; inside a window it cuts at once; one after the last window stays
    pending, and leaving the held stretch does not raise it."""
    guard = DeferredInterrupt()
    guard.install()
    try:
        done = []
        with guard.held():
            _press_ctrl_c()  # between windows: waits
            done.append("between")
            with pytest.raises(KeyboardInterrupt), guard.window():
                done.append("window entered")  # never: the pending signal is raised first
            assert not guard.pending
            with guard.window():  # only the first signal interrupts: this one runs through
                done.append("window")
        assert done == ["between", "window"]
    finally:
        guard.uninstall()
    fresh = DeferredInterrupt()
    fresh.install()
    try:
        with fresh.held():
            with pytest.raises(KeyboardInterrupt), fresh.window():
                with fresh.critical():  # a record written inside a window is finished
                    _press_ctrl_c()
                    done.append("record")
            assert fresh.depth == 1, "the window gives the held stretch its depth back"
            _press_ctrl_c()  # a second signal: counted, ignored
        assert done[-1] == "record" and fresh.count == 2 and not fresh.pending
    finally:
        fresh.uninstall()
    late = DeferredInterrupt()
    late.install()
    try:
        with late.held():
            with late.held():
                _press_ctrl_c()
                for _ in range(1000):
                    pass
            assert late.pending and late.received == "SIGINT"  # for the caller to record
        assert not late.pending, "dropped when the outermost held stretch ends"
        late.check()  # nothing left to raise
    finally:
        late.uninstall()
