"""Ctrl-C as a mechanism: a stop flag that llama.cpp reads, set the moment SIGINT arrives.

Python runs a signal handler only between bytecodes of the main thread, which loses a
Ctrl-C in two places this program spends its time:

- inside a ctypes callback. llama.cpp calls its log callback on the main thread all
  through a model load; a KeyboardInterrupt raised there is printed as "Exception
  ignored" and dropped by ctypes, and the load (then the whole generation) goes on;
- inside one long llama.cpp call (a prefill of thousands of tokens), where no bytecode
  runs until it returns.

So, once `install()`ed (by `run`, `chat` and `inferenceos.load`, on the main thread):

- the SIGINT handler raises KeyboardInterrupt as Python's own does, except when the
  main thread is inside a function marked with `callback` (a ctypes callback): there it
  only sets the flag, and the code after the C call turns the flag into the
  KeyboardInterrupt (`check()`);
- a watcher thread, woken through the signal wakeup fd by the C-level handler itself,
  sets the flag at once, while the main thread is still inside llama.cpp;
- llama.cpp polls the flag between graph nodes (`abort_function()`, installed as each
  context's abort callback, reads it in C without taking the GIL) and between load
  steps (the progress callback), so a prefill or a load stops within milliseconds and
  returns "aborted", which the caller turns into KeyboardInterrupt.

And wherever else Python would drop a KeyboardInterrupt (a weakref callback of
importlib's module locks while the CLI imports, a `__del__`, a ctypes callback not
marked): `guard_unraisable()` turns the dropped one into the flag and delivers it to the
main thread again, so the next bytecode there raises it (tests/cli/test_interrupt.py).

The flag means "the user asked to stop what runs now": `reset()` clears it when a new
action starts (a chat reply, an API call), so a stale flag never stops the next one.
This module is a leaf: ctypes and the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, NoReturn, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# byte 0: non-zero when a stop is asked for; byte 1 stays 0, so strlen() of the buffer is
# 1 when set and 0 when not (see abort_function)
_flag = ctypes.create_string_buffer(2)
_callback_codes: set[CodeType] = set()
_install_lock = threading.Lock()
_installed = False
_MAX_FRAMES = 64  # how far up the stack a callback is looked for


def requested() -> bool:
    """Whether a stop was asked for and not yet turned into a KeyboardInterrupt."""
    return _flag.raw[0] != 0


def request() -> None:
    """Ask the running work to stop (what a Ctrl-C does)."""
    _flag[0] = b"\x01"


def reset() -> None:
    """Forget a stop request: a new action starts."""
    _flag[0] = b"\x00"


def check() -> None:
    """Raise KeyboardInterrupt (and clear the flag) if a stop was asked for. Call it after
    a llama.cpp call that may have run callbacks, and between steps of a loop."""
    if requested():
        reset()
        raise KeyboardInterrupt


def flag_address() -> int:
    """The address of the flag, as llama.cpp's callback data (`void *`)."""
    return ctypes.addressof(_flag)


def abort_function() -> int:
    """The address of a C function `bool f(void *data)` that is true when the flag at
    `data` is set: the C library's `strlen` over the two-byte flag (1 when set, else 0).

    llama.cpp calls its abort callback between every two graph nodes; a Python callback
    there would take the GIL hundreds of times a token (several per cent of decode
    speed), this costs a nanosecond and needs no Python at all."""
    libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
    address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    assert address is not None
    return address


def callback(fn: F) -> F:
    """Mark `fn` as called from C (a ctypes callback): a Ctrl-C that lands while it runs
    sets the flag instead of raising a KeyboardInterrupt that ctypes would drop."""
    _callback_codes.add(getattr(fn, "__func__", fn).__code__)
    return fn


def _in_callback(frame: FrameType | None) -> bool:
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return False
        if frame.f_code in _callback_codes:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    request()  # llama.cpp's checks see it whatever Python does next
    if _in_callback(frame):
        return  # a raise here would be dropped: the code after the C call check()s
    reset()
    raise KeyboardInterrupt


def _watch(fd: int) -> None:
    """Set the flag for every SIGINT the C-level handler reports, while the main thread
    may still be inside llama.cpp (with the GIL released)."""
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            request()


def _redeliver(unraisable: Any) -> None:
    """sys.unraisablehook: a KeyboardInterrupt that Python could only print as
    "Exception ignored" (raised where no caller can catch it) is raised again in the main
    thread once this hook has returned (`_deliver`); anything else goes to the hook that
    was there before."""
    global _hook_depth
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        _previous_hook(unraisable)
        return
    _hook_depth += 1
    request()  # llama.cpp's checks see it whatever the main thread does next
    _dropped.set()
    _hook_depth -= 1


def _deliver() -> None:
    """Raise each dropped KeyboardInterrupt again in the main thread. Not from the hook
    itself: a signal raised there would be handled at the hook's next bytecode, inside
    the hook, and dropped again; from here it lands in the code the hook returns to (and
    if that is another place that drops it, the hook sends it here once more)."""
    while True:
        _dropped.wait()
        _dropped.clear()
        while _hook_depth:
            time.sleep(0.001)
        # a real signal, not _thread.interrupt_main (which only marks one pending): it
        # also wakes a main thread blocked in a lock or a read, as the first one did
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


_previous_hook: Callable[[Any], object] = sys.unraisablehook
_dropped = threading.Event()
_hook_depth = 0


def guard_unraisable() -> None:
    """Make a Ctrl-C that lands where Python drops exceptions count anyway (see the
    module's docstring). Idempotent; only the process's entry point should call it, since
    it replaces `sys.unraisablehook` for the whole process."""
    global _previous_hook
    with _install_lock:
        if sys.unraisablehook is _redeliver:
            return
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _redeliver
        threading.Thread(target=_deliver, name="sigint-redeliver", daemon=True).start()


def install() -> bool:
    """Take over SIGINT as described above; True when it is (or already was) ours.

    Only from the main thread, and only when SIGINT still has Python's default handler
    (a program that set its own keeps it). The wakeup fd is left alone when someone else
    (an asyncio loop) holds it: then only the watcher thread is missing, and a long
    prefill stops when it returns instead of at once."""
    global _installed
    with _install_lock:
        if _installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return False
        signal.signal(signal.SIGINT, _on_sigint)
        with contextlib.suppress(ValueError, OSError):
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            if previous != -1:  # someone else's: give it back, go without the watcher
                signal.set_wakeup_fd(previous)
                os.close(read_fd)
                os.close(write_fd)
            else:
                threading.Thread(target=_watch, args=(read_fd,), name="sigint-watch",
                                 daemon=True).start()
        _installed = True
        return True


def interrupted_inside(exc: BaseException) -> bool:
    """Whether `exc` wraps a Ctrl-C. Before Python 3.12, an exception raised in a
    descriptor's __set_name__ while a class is defined comes back as a RuntimeError
    with it as the cause, so a Ctrl-C while such a module is imported ended in "internal
    error" and exit 70 (the interrupt stress test's moment at 2.45 s), or, while the
    entry point imported Typer (ipaddress's IPv6Interface), in a traceback and exit 1."""
    seen: set[int] = set()
    inner = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        if isinstance(inner, KeyboardInterrupt):
            return True
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    return False


def exit_now(code: int = 0) -> NoReturn:
    """End the process with `code` once its work is done and saved: the atexit handlers
    run (the telemetry recorder's last flush), output is flushed, and the interpreter's
    own teardown (freeing every module, llama.cpp's libraries) is skipped. That teardown
    took 0.2 s of a quiet `serve`'s exit after Ctrl-C, and past a second beside other
    work (benchmarks/interrupt.py)."""
    import atexit

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    exit_interrupted(code)


def exit_interrupted(code: int = 130) -> NoReturn:
    """End the process with `code` after a Ctrl-C was handled (the message printed).

    Not `sys.exit`: measured here, about one Ctrl-C in five that landed while the CLI was
    still importing or planning ended the process by SIGINT (status -2, after our
    "error: interrupted" and `sys.exit(130)`), because CPython re-raises SIGINT at the end
    of interpreter finalisation when it has marked a KeyboardInterrupt as unhandled. An
    exit that skips finalisation reports the status we chose, and does not wait on
    threads still busy with the work that was stopped. Output is flushed first; what
    must be durable (telemetry, the registry) is committed before this is reached."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
