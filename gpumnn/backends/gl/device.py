"""OpenGL contexts, reused across GL backends, each with the compute programs compiled in it.

Why a pool: creating and releasing a standalone EGL context costs about 40 KiB of resident
memory that Mesa (22.x, llvmpipe) never gives back, and compiling a model's compute programs
again in every new context costs more (and 0.05-1 s). A GL backend that closes deletes its
buffers, makes its context current in no thread and hands it back here with its programs; the
next backend takes it. At most ``MAX_IDLE`` contexts wait here (the rest are released), and
each keeps at most ``MAX_PROGRAMS`` programs (least recently used are deleted first), so the
pool is bounded however many sessions a process opens. :func:`release_idle_contexts` (run at
interpreter exit) releases the waiting ones.

Only EGL contexts are pooled: an EGL context can be made current in another thread once the
thread that used it last has let go of it (eglMakeCurrent with no context), which the pool does
on return. Contexts of other platforms (GLX) are released as before.
"""
from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import moderngl

from .. import deferred

#: idle contexts kept for the next backend
MAX_IDLE = 4
#: programs a pooled context keeps (least recently used are deleted first)
MAX_PROGRAMS = 256

_lock = threading.Lock()
_idle: list["PooledContext"] = []
_egl: Any = None
#: closes of GL backends that dropped sessions' finalizers queued: a GL context may be current in
#: another thread, or the collector may run inside another context's bracket, so they wait for the
#: outermost GL bracket of some thread (``GLBackend.activate``) or interpreter exit
releases = deferred.DeferredReleases("gl")


class PooledContext:
    """A moderngl context and the programs compiled in it, keyed by (kernel, defines)."""

    def __init__(self, ctx: moderngl.Context, platform: str):
        self.ctx = ctx
        self.platform = platform
        self.programs: OrderedDict[tuple, Any] = OrderedDict()
        self._timestamps: Timestamps | None | bool = False  # False: not asked yet
        self._fences: Fences | None | bool = False  # likewise

    def fences(self) -> "Fences | None":
        """Fence syncs for this context, or None where the GL library lacks them."""
        if self._fences is False:
            self._fences = Fences.create()
        return self._fences or None

    def timestamps(self) -> "Timestamps | None":
        """The context's pair of timestamp queries (made on first use, while the context is
        current, and kept with it), or None where the GL library has no timestamp queries."""
        if self._timestamps is False:
            self._timestamps = Timestamps.create()
        return self._timestamps or None

    def program(self, key: tuple, build: Callable[[], Any]) -> tuple[Any, bool]:
        """The program under ``key``, built by ``build()`` if absent; (program, built now)."""
        program = self.programs.get(key)
        if program is not None:
            self.programs.move_to_end(key)
            return program, False
        program = build()
        self.programs[key] = program
        return program, True

    def trim(self) -> None:
        while len(self.programs) > MAX_PROGRAMS:
            _, program = self.programs.popitem(last=False)
            program.prog.release()

    def release(self) -> None:
        """Delete the programs and the context (it must be current in this thread). The context
        is made current nowhere before it is destroyed: EGL destroys a context that is still
        current only once it is let go, so it stayed current in this thread, and the brackets
        that save and restore what is current then restored a dead context, leaving the next
        backend's context current here for good (another thread could not make it current, and
        that backend's close deleted its buffer names in whatever context was current there)."""
        try:
            for program in self.programs.values():
                program.prog.release()
            if self._timestamps:
                self._timestamps.release()
        finally:
            self.programs.clear()
            _let_go_egl()
            self.ctx.release()


@functools.lru_cache(maxsize=1)
def gl_library() -> ctypes.CDLL | None:
    """The GL library (glvnd's libOpenGL, else libGL) for the few calls moderngl does not make,
    or None where none loads. Its functions act on the context current in the calling thread."""
    for name in ("libOpenGL.so.0", "libGL.so.1", "libGL.so", "opengl32"):
        try:
            lib = ctypes.CDLL(name)
            lib.glGetIntegerv  # noqa: B018 -- a GL library at all
        except (OSError, AttributeError):
            continue
        return lib
    return None


_GL_TIMESTAMP = 0x8E28
_GL_QUERY_COUNTER_BITS = 0x8864
_GL_QUERY_RESULT = 0x8866


class Timestamps:
    """Two GL_TIMESTAMP queries (glQueryCounter: GL 3.3 / ARB_timer_query) of one context, each
    written by the GL when every command issued before it has completed. A GL_TIME_ELAPSED
    query (what moderngl offers) would be simpler but is no good here: llvmpipe counts only
    draws in it and gives 0 for compute dispatches, whose timestamps it does write."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        self._ids = (ctypes.c_uint * 2)()
        self._values = (ctypes.c_uint64 * 2)()
        lib.glGenQueries(2, self._ids)

    @classmethod
    def create(cls) -> "Timestamps | None":
        """A pair for the current context, or None where the library lacks the calls or the
        GL's timestamp counter has no bits."""
        lib = gl_library()
        if lib is None or not all(hasattr(lib, f) for f in ("glGenQueries", "glQueryCounter", "glGetQueryiv",
                                                            "glGetQueryObjectui64v", "glDeleteQueries")):
            return None
        bits = ctypes.c_int(0)
        lib.glGetQueryiv(_GL_TIMESTAMP, _GL_QUERY_COUNTER_BITS, ctypes.byref(bits))
        return cls(lib) if bits.value > 0 else None

    def stamp(self, index: int) -> None:
        """Have the GL write timestamp ``index`` (0 or 1) once the commands before it are done."""
        self._lib.glQueryCounter(self._ids[index], _GL_TIMESTAMP)

    def seconds(self) -> float:
        """Timestamp 1 less timestamp 0 (waiting for them to be written)."""
        for i in (0, 1):
            self._lib.glGetQueryObjectui64v(self._ids[i], _GL_QUERY_RESULT, ctypes.byref(self._values, 8 * i))
        return max(0, self._values[1] - self._values[0]) * 1e-9

    def release(self) -> None:
        self._lib.glDeleteQueries(2, self._ids)


_GL_SYNC_GPU_COMMANDS_COMPLETE = 0x9117
_GL_SYNC_FLUSH_COMMANDS_BIT = 0x1
_GL_WAIT_DONE = (0x911A, 0x911C)  # GL_ALREADY_SIGNALED, GL_CONDITION_SATISFIED
_GL_WAIT_FAILED = 0x911D
_GL_WAIT_STEP_NS = 10**9


class Fences:
    """Fence syncs (GL 3.2 / ARB_sync): ``fence`` puts one behind the commands issued so far and
    flushes them to the GL, ``wait`` waits for it on the host and deletes it. What a GL submit
    without waiting returns (moderngl has only ``finish``, which waits for everything)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        lib.glFenceSync.restype = ctypes.c_void_p
        lib.glFenceSync.argtypes = [ctypes.c_uint, ctypes.c_uint]
        lib.glClientWaitSync.restype = ctypes.c_uint
        lib.glClientWaitSync.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint64]
        lib.glDeleteSync.argtypes = [ctypes.c_void_p]

    @classmethod
    def create(cls) -> "Fences | None":
        lib = gl_library()
        if lib is None or not all(hasattr(lib, f) for f in ("glFenceSync", "glClientWaitSync", "glDeleteSync",
                                                            "glFlush")):
            return None
        return cls(lib)

    def fence(self) -> int:
        """A fence behind every command issued so far, flushed (the GL starts on them now)."""
        sync = self._lib.glFenceSync(_GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
        self._lib.glFlush()
        return sync

    def wait(self, sync: int, timeout: float | None = None) -> bool | None:
        """Wait until the commands before ``sync`` are done, then delete it; False where the GL
        says the wait failed, None where ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                step = _GL_WAIT_STEP_NS if deadline is None else int(1e9 * min(1.0, max(0.0, deadline - time.monotonic())))
                result = self._lib.glClientWaitSync(sync, _GL_SYNC_FLUSH_COMMANDS_BIT, step)
                if result in _GL_WAIT_DONE:
                    return True
                if result == _GL_WAIT_FAILED:
                    return False
                if deadline is not None and time.monotonic() >= deadline:
                    return None
        finally:
            self._lib.glDeleteSync(sync)


def _create(create: Callable[[str | None], moderngl.Context]) -> PooledContext:
    errors = []
    for platform in ("egl", None):
        try:
            return PooledContext(create(platform), platform or "default")
        except Exception as exc:  # noqa: BLE001 -- missing libEGL, no display, GL < 4.3, ...
            errors.append(f"{platform or 'default'}: {type(exc).__name__}: {exc}")
    from ...errors import BackendUnavailableError
    raise BackendUnavailableError("no OpenGL 4.3+ context (compute shaders) could be created: "
                                  + "; ".join(errors))


def acquire(create: Callable[[str | None], moderngl.Context]) -> PooledContext:
    """An idle pooled context made current in this thread, else a new one from ``create``
    (called with "egl", then None for moderngl's default platform)."""
    with _lock:
        pooled = _idle.pop() if _idle else None
    if pooled is None:
        return _create(create)
    pooled.ctx.__enter__()
    return pooled


def _egl_lib() -> Any:
    global _egl
    if _egl is None:
        lib = ctypes.CDLL("libEGL.so.1")
        lib.eglGetCurrentDisplay.restype = ctypes.c_void_p
        lib.eglGetCurrentContext.restype = ctypes.c_void_p
        lib.eglGetCurrentSurface.restype = ctypes.c_void_p
        lib.eglGetCurrentSurface.argtypes = [ctypes.c_int32]
        lib.eglMakeCurrent.argtypes = [ctypes.c_void_p] * 4
        lib.eglMakeCurrent.restype = ctypes.c_uint
        _egl = lib
    return _egl


_EGL_DRAW, _EGL_READ = 0x3059, 0x305A


def current_egl() -> tuple | None:
    """What EGL has current in this thread (display, draw, read, context), None if nothing.

    A backend's bracket saves it on entry and puts it back on exit, so brackets of different
    backends nest in one thread: a session closed by the garbage collector in the middle of
    another GL session's work leaves that session's context current.
    """
    try:
        egl = _egl_lib()
    except OSError:
        return None
    context = egl.eglGetCurrentContext()
    if not context:
        return None
    return (egl.eglGetCurrentDisplay(), egl.eglGetCurrentSurface(_EGL_DRAW), egl.eglGetCurrentSurface(_EGL_READ),
            context)


def make_current_egl(state: tuple) -> None:
    """Make ``state`` (from :func:`current_egl`) current again in this thread."""
    _egl_lib().eglMakeCurrent(*state)


def current_context() -> int | None:
    """The EGL context current in this thread (its handle), None if none."""
    state = current_egl()
    return None if state is None else state[3]


def _let_go_egl() -> bool:
    """Make no EGL context current in this thread, so another thread may take it."""
    try:
        egl = _egl_lib()
        display = egl.eglGetCurrentDisplay()
        return not display or bool(egl.eglMakeCurrent(display, None, None, None))
    except OSError:
        return False


def give_back(pooled: PooledContext) -> None:
    """Take back a context whose backend has deleted its buffers; it must be current in this
    thread. Pooled (with its programs) if there is room and it is EGL, else released."""
    pooled.ctx.finish()
    pooled.trim()
    with _lock:
        keep = pooled.platform == "egl" and len(_idle) < MAX_IDLE
    if keep and _let_go_egl():
        with _lock:
            _idle.append(pooled)
        return
    pooled.release()


def release_idle_contexts() -> int:
    """Release every idle pooled context (and its programs); returns how many."""
    with _lock:
        idle = list(_idle)
        _idle.clear()
    for pooled in idle:
        try:
            pooled.ctx.__enter__()
            pooled.release()
        except Exception:  # noqa: BLE001 -- at exit, the driver may already be gone
            pass
    if idle:
        _let_go_egl()
    return len(idle)


deferred.on_exit(release_idle_contexts)  # after every open session is closed (see deferred)

__all__ = ["MAX_IDLE", "MAX_PROGRAMS", "PooledContext", "acquire", "give_back", "release_idle_contexts", "releases"]
