"""Ctrl-C deferred past the run's record writes (``orchestration/interrupts.py``): a real
SIGINT sent to this process, inside and outside critical sections."""

from __future__ import annotations

import os
import signal

import pytest

from kernelarc.orchestration.interrupts import DeferredInterrupt


def _press_ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


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
        with pytest.raises(KeyboardInterrupt):
            _press_ctrl_c()  # outside a section: at once
            for _ in range(1000):
                pass
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


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
