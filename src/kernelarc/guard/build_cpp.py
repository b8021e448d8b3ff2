"""The C++/CUDA builder: compile a solution into a torch extension, in a separate process.

Parent side, :class:`CudaCppBuilder` (languages cuda_cpp, cutlass, cudnn, cublas):

1. Lock the cache entry ``<cache_dir>/cpp/<content_hash>/`` (``fcntl.flock``) so two processes
   building the same solution wait for each other instead of racing.
2. Reuse a finished entry: ``ok.json`` (written last, by atomic rename) means the ``.so`` is
   there (its sha256 is checked); ``fail.json`` means the sources do not compile, and the same
   error is raised again without rebuilding. An entry recorded under another toolchain
   (torch version, Python, final flags) is rebuilt.
3. Otherwise stage the sources in the entry and run ``python -m kernelarc.guard.build_cpp
   --spec JSON`` in a new session, with the time limit; on timeout the whole process tree
   (ninja and the compilers, which ninja puts in groups of their own) is frozen and killed.
   Timeouts and toolchain problems (no ninja, CPU-only torch for ``.cu``) are not cached.
4. Copy the ``.so`` next to freshly staged sources in ``<work_dir>/<content_hash>/``, so the
   candidate never loads from the cache itself.

For ``.cu`` sources the local GPU architecture is read with ``nvidia-smi`` and compiled for
with ``-gencode=arch=compute_XX,code=sm_XX`` (the arch-specific ``a`` variant from Hopper on:
``sm_90a``), unless the solution's ``cuda_cflags`` already name an architecture.

Child side, :func:`main`: calls ``torch.utils.cpp_extension.load`` (which also imports the
built module, so undefined symbols are caught here) and checks that the entry symbol exists.
It writes a :class:`CppBuildResult` to the file the spec names.

Not covered: CUTLASS or cuDNN include/library discovery (pass them in ``compile_options``),
sandboxing of the compiler, and loading in the worker (``build.load_entry``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

import kernelarc
from kernelarc.env import is_secret, parent_environment
from kernelarc.guard.build_base import (
    BuildArtifact,
    Builder,
    BuildError,
    file_lock,
    kill_process_tree,
    module_name_for,
    read_json,
    sha256_file,
    stage_sources,
    write_json_atomic,
)
from kernelarc.problem.schema import CPP_LANGUAGES, CompileOptions, Solution

#: Sources handed to the compiler; anything else (headers, data) is only staged.
COMPILED_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu")
CACHE_FORMAT = 1
_LOCK_GRACE_S = 60.0


class CppBuildSpec(BaseModel):
    """What the build process is asked to do (passed as JSON on its command line)."""

    name: str
    sources: list[str]
    include_dirs: list[str]
    build_directory: str
    cflags: list[str]
    cuda_cflags: list[str]
    ldflags: list[str]
    symbol: str
    result_path: str


@dataclass(frozen=True)
class CppPlan:
    """The flags and names one build uses (the fingerprint decides cache validity)."""

    name: str
    digest: str
    compiled: list[str]
    cflags: list[str]
    cuda_cflags: list[str]
    ldflags: list[str]
    arch_list: str | None
    note: str
    fingerprint: dict[str, Any]


FailureKind = Literal["compile", "load", "symbol", "environment"]


class CppBuildResult(BaseModel):
    """What the build process reports back. ``kind`` decides whether a failure is cached."""

    ok: bool
    kind: FailureKind | None = None
    reason: str = ""
    library: str | None = None


# ------------------------------------------------------------------------------ architectures


def local_cuda_capabilities() -> tuple[list[str], str]:
    """Compute capabilities of the visible GPUs (e.g. ``["9.0"]``) and a note saying how."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found: no local GPU architecture added"
    try:
        out = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi failed ({e}): no local GPU architecture added"
    caps = sorted(
        {ln.strip() for ln in out.stdout.splitlines() if re.fullmatch(r"\d+\.\d+", ln.strip())}
    )
    if out.returncode != 0 or not caps:
        why = (out.stderr or out.stdout).strip().splitlines()[:1]
        return [], f"nvidia-smi found no GPU ({'; '.join(why)}): no local GPU architecture added"
    return caps, f"local GPU compute capability {', '.join(caps)}"


def arch_name(capability: str) -> str:
    """``"9.0"`` → ``"9.0a"``: from Hopper on, the arch-specific target (wgmma, tcgen05)."""
    major = int(capability.split(".")[0])
    return capability + "a" if major >= 9 else capability


def gencode_flag(arch: str) -> str:
    """``"9.0a"`` → ``"-gencode=arch=compute_90a,code=sm_90a"``."""
    num = arch.replace(".", "")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def names_arch(flags: Sequence[str]) -> bool:
    """Whether nvcc flags already choose a target (torch's own test: 'arch' in a flag)."""
    return any("arch" in f for f in flags if "TORCH_EXTENSION_NAME" not in f)


# ------------------------------------------------------------------------------ parent side


def _child_env(arch_list: str | None) -> dict[str, str]:
    env = {k: v for k, v in parent_environment().items() if not is_secret(k)}
    src_root = str(Path(kernelarc.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH")) if p)
    if arch_list is not None:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    return env


def _run_child(
    spec: CppBuildSpec, env: dict[str, str], cwd: Path, timeout: float
) -> tuple[int | None, str]:
    """Run the build process; ``(None, partial output)`` when it ran out of time."""
    cmd = [sys.executable, "-m", "kernelarc.guard.build_cpp", "--spec", spec.model_dump_json()]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        kill_process_tree(proc.pid)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # something left the tree and still holds the pipe
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()
            out = "(output unavailable: a build process escaped and kept the output pipe open)"
        return None, out


def _fingerprint(cflags: list[str], cuda_cflags: list[str], ldflags: list[str]) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return {
        "format": CACHE_FORMAT,
        "torch": torch_version,
        "python": sys.executable,
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cflags": cflags,
        "cuda_cflags": cuda_cflags,
        "ldflags": ldflags,
    }


def first_error_line(text: str) -> str:
    """The compiler's first ``error`` line, to serve as a short reason."""
    for line in text.splitlines():
        if re.search(r"\berror\b", line, re.IGNORECASE) and "Error building extension" not in line:
            return line.strip()[:300]
    return ""


class CudaCppBuilder(Builder):
    """C++-group solutions, built as torch extensions (``PYBIND11_MODULE``)."""

    name = "cuda_cpp"

    def __init__(self, cuda_capabilities: Sequence[str] | None = None) -> None:
        """``cuda_capabilities``: target these (e.g. ``["9.0"]``) instead of asking nvidia-smi."""
        self._capabilities = None if cuda_capabilities is None else list(cuda_capabilities)

    def why_not(self, solution: Solution) -> str | None:
        other = [lang.value for lang in solution.spec.languages if lang not in CPP_LANGUAGES]
        if other:
            return f"{self.name}: does not build {', '.join(other)}"
        if not solution.spec.entry_file.endswith(COMPILED_SUFFIXES):
            return (
                f"{self.name}: entry file {solution.spec.entry_file!r} is not a compiled "
                f"source ({', '.join(COMPILED_SUFFIXES)})"
            )
        return None

    def plan(self, solution: Solution) -> CppPlan:
        """Everything a build of ``solution`` uses, before anything runs."""
        opts = solution.spec.compile_options or CompileOptions()
        cuda_cflags = list(opts.cuda_cflags)
        has_cu = any(s.path.endswith(".cu") for s in solution.sources)
        arch_list: str | None = None
        if not has_cu:
            note = "no .cu sources: no CUDA architecture needed"
        elif names_arch(cuda_cflags):
            note = "cuda_cflags name the target architecture: kept as given"
        else:
            if self._capabilities is None:
                caps, note = local_cuda_capabilities()
            else:
                caps, note = self._capabilities, f"target compute capability {self._capabilities}"
            archs = [arch_name(c) for c in caps]
            if archs:
                cuda_cflags += [gencode_flag(a) for a in archs]
                arch_list = ";".join(archs)
        cflags, ldflags = list(opts.cflags), list(opts.ld_flags)
        return CppPlan(
            name=module_name_for(solution),
            digest=solution.content_hash(),
            compiled=[s.path for s in solution.sources if s.path.endswith(COMPILED_SUFFIXES)],
            cflags=cflags,
            cuda_cflags=cuda_cflags,
            ldflags=ldflags,
            arch_list=arch_list,
            note=note,
            fingerprint=_fingerprint(cflags, cuda_cflags, ldflags),
        )

    def build(
        self, solution: Solution, *, work_dir: Path, cache_dir: Path, timeout: float
    ) -> BuildArtifact:
        reason = self.why_not(solution)
        if reason is not None:
            raise BuildError(reason)
        plan = self.plan(solution)
        entry = cache_dir / "cpp" / plan.digest
        entry.mkdir(parents=True, exist_ok=True)
        with file_lock(entry / ".lock", timeout + _LOCK_GRACE_S):
            library, log, cached = self._build_locked(solution, plan, entry, timeout)
            root = work_dir / plan.digest
            stage_sources(solution, root)
            module_path = root / library.name
            tmp = root / f".{library.name}.tmp"
            shutil.copy2(library, tmp)
            os.replace(tmp, module_path)
        return BuildArtifact(
            builder=self.name,
            root=root,
            module_path=module_path,
            module_name=plan.name,
            symbol=solution.spec.entry_symbol,
            content_hash=plan.digest,
            log=log,
            cached=cached,
        )

    def _build_locked(
        self, solution: Solution, plan: CppPlan, entry: Path, timeout: float
    ) -> tuple[Path, str, bool]:
        """Reuse the cache entry or build into it; the caller holds the entry's lock."""
        fingerprint = plan.fingerprint
        ok_path, fail_path, log_path = entry / "ok.json", entry / "fail.json", entry / "build.log"
        build_dir = entry / "build"
        ok = read_json(ok_path)
        if ok is not None and ok.get("fingerprint") == fingerprint:
            library = entry / str(ok.get("library", ""))
            if library.is_file() and sha256_file(library) == ok.get("sha256"):
                log = log_path.read_text(encoding="utf-8") if log_path.is_file() else ""
                return library, log, True
        fail = read_json(fail_path)
        if fail is not None and fail.get("fingerprint") == fingerprint:
            log = log_path.read_text(encoding="utf-8") if log_path.is_file() else ""
            raise BuildError(
                f"{fail.get('reason', 'build failed')} (cached result of an earlier build; "
                f"delete {entry} to rebuild)",
                log,
            )
        for stale in (ok_path, fail_path, log_path):
            stale.unlink(missing_ok=True)
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir()
        src_dir = entry / "src"
        stage_sources(solution, src_dir)
        result_path = entry / "result.json"
        result_path.unlink(missing_ok=True)
        spec = CppBuildSpec(
            name=plan.name,
            sources=[str(src_dir / p) for p in plan.compiled],
            include_dirs=[str(src_dir)],
            build_directory=str(build_dir),
            cflags=plan.cflags,
            cuda_cflags=plan.cuda_cflags,
            ldflags=plan.ldflags,
            symbol=solution.spec.entry_symbol,
            result_path=str(result_path),
        )
        header = (
            f"[kernelarc] {plan.note}\n"
            f"[kernelarc] building {plan.name} from {', '.join(plan.compiled)}\n"
            f"[kernelarc] cflags {plan.cflags} cuda_cflags {plan.cuda_cflags} "
            f"ld_flags {plan.ldflags}\n"
        )
        start = time.monotonic()
        rc, out = _run_child(spec, _child_env(plan.arch_list), entry, timeout)
        log = header + out
        if rc is None:
            raise BuildError(f"build timed out after {timeout:g} s", log)
        log += f"[kernelarc] build process exited {rc} after {time.monotonic() - start:.1f} s\n"
        result = read_json(result_path)
        result_path.unlink(missing_ok=True)
        log_path.write_text(log, encoding="utf-8")
        if result is None:
            raise BuildError(f"build process exited {rc} without reporting a result", log)
        res = CppBuildResult.model_validate(result)
        if not res.ok or res.library is None:
            reason = (res.reason or f"build failed (exit {rc})").replace(f"{src_dir}{os.sep}", "")
            if res.kind != "environment":
                write_json_atomic(fail_path, {"fingerprint": fingerprint, "reason": reason})
            raise BuildError(reason, log)
        library = Path(res.library)
        if not library.is_file():
            raise BuildError(f"build reported {library} but it does not exist", log)
        rel = str(library.relative_to(entry))
        write_json_atomic(
            ok_path, {"fingerprint": fingerprint, "library": rel, "sha256": sha256_file(library)}
        )
        return library, log, False


# ------------------------------------------------------------------------------ child side


def run_build(spec: CppBuildSpec) -> CppBuildResult:
    """Compile and import the extension in this process (the build subprocess)."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        return CppBuildResult(ok=False, kind="environment", reason=f"torch does not import: {e}")
    if any(s.endswith(".cu") for s in spec.sources) and torch.version.cuda is None:
        return CppBuildResult(
            ok=False,
            kind="environment",
            reason=f"torch {torch.__version__} has no CUDA support, so .cu sources cannot be "
            "built here; install a CUDA build of torch",
        )
    try:
        module = cpp_extension.load(
            name=spec.name,
            sources=spec.sources,
            extra_cflags=spec.cflags,
            extra_cuda_cflags=spec.cuda_cflags,
            extra_ldflags=spec.ldflags,
            extra_include_paths=spec.include_dirs,
            build_directory=spec.build_directory,
            verbose=False,
        )
    except RuntimeError as e:
        text = str(e)
        print(text, file=sys.stderr)
        if text.startswith("Error building extension"):
            line = first_error_line(text)
            return CppBuildResult(
                ok=False, kind="compile", reason=f"compilation failed: {line or text[:300]}"
            )
        return CppBuildResult(ok=False, kind="environment", reason=text.splitlines()[0][:300])
    except ImportError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return CppBuildResult(ok=False, kind="load", reason=f"built module does not load: {e}")
    except Exception as e:  # any other toolchain problem: reported, not cached
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return CppBuildResult(ok=False, kind="environment", reason=f"{type(e).__name__}: {e}")
    fn = getattr(module, spec.symbol, None)
    if not callable(fn):
        exported = sorted(n for n in dir(module) if not n.startswith("_"))
        return CppBuildResult(
            ok=False,
            kind="symbol",
            reason=f"entry point {spec.symbol!r} is not exported by PYBIND11_MODULE; "
            f"exported: {', '.join(exported) or 'nothing'}",
        )
    return CppBuildResult(ok=True, library=str(module.__file__))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build one C++/CUDA solution (internal).")
    parser.add_argument("--spec", required=True, help="CppBuildSpec as JSON")
    args = parser.parse_args(argv)
    spec = CppBuildSpec.model_validate_json(args.spec)
    result = run_build(spec)
    out = Path(spec.result_path)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(result.model_dump_json(), encoding="utf-8")
    os.replace(tmp, out)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
