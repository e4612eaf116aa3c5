"""GLSL compute shaders: one set of sources, an API prelude each, SPIR-V compilation and caching.

Kernel bodies in ``gpumnn/backends/kernels/glsl/*.comp`` are API-neutral: they use ``BUFFER_RO/WO/RW``
for storage buffers, ``PI(i)`` / ``PF(i)`` for the i-th 32-bit int / float parameter and
``GLOBAL_ID()`` for the linear invocation index. :func:`preprocess` puts an API prelude in
front (``prelude_vulkan.glsl``: ``#version 450``, set/binding layouts, a push-constant block;
``prelude_gl.glsl``: ``#version 430``, bindings, a uniform array), then the ``#define``s of the
variant, then the body with every ``#include "file"`` inlined (once per file), so that the
result needs no include support from the GLSL compiler or driver.

:func:`compile_glsl` turns a Vulkan variant into SPIR-V with ``glslangValidator`` (Debian
package ``glslang-tools``) or ``glslc`` (package ``glslc`` / ``shaderc``), caching the binary in
memory and on disk (``~/.cache/gpumnn/spirv/``, or ``$GPUMNN_CACHE_DIR/spirv``; checksummed and
published atomically by :mod:`gpumnn.diskcache`) under the hash of the final source, the compiler
and its version.
"""
from __future__ import annotations

import hashlib
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
    prelude = _read(f"prelude_{api}.glsl")
    return "\n".join([prelude, _define_lines(defines), "#line 1", _inline_includes(body, set()), ""])


# ------------------------------------------------------------------------------------------
# Compiler
# ------------------------------------------------------------------------------------------

def find_compiler() -> tuple[str, str, str]:
    """(kind, path, version) of the GLSL compiler to use; raises ShaderCompilerNotFound."""
    global _compiler
    if _compiler is not None:
        return _compiler
    override = os.environ.get("GPUMNN_GLSL_COMPILER")
    candidates = [override] if override else ["glslangValidator", "glslang", "glslc"]
    for exe in candidates:
        path = shutil.which(exe) if exe else None
        if not path:
            continue
        kind = "glslc" if Path(path).name.startswith("glslc") else "glslang"
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            version = (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "?"
        except (OSError, subprocess.SubprocessError):
            continue
        _compiler = (kind, path, version)
        return _compiler
    raise ShaderCompilerNotFound(
        "no GLSL to SPIR-V compiler found (looked for glslangValidator, glslang and glslc on PATH). "
        "Install the Debian/Ubuntu package 'glslang-tools' (provides glslangValidator) or 'glslc' "
        "(shaderc), e.g. `apt-get install glslang-tools`, or set GPUMNN_GLSL_COMPILER.")


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


__all__ = ["GLSL_DIR", "ShaderCompileError", "ShaderCompilerNotFound", "compile_glsl",
           "find_compiler", "preprocess"]
