"""Tests of the guard's build layer: staging, syntax checks, loading, builder choice, C++ builds.

The C++ tests build real torch extensions (a ``.cpp`` one links against CPU torch), so they
are the slow part: one successful build, one failing build and one build killed by its time
limit. ``.cu`` extensions need a CUDA build of torch and run only where there is one.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelarc.guard.build import (
    PYTHON_LANGUAGE_PACKAGES,
    BuildArtifact,
    BuildError,
    PythonBuilder,
    builders,
    choose_builder,
    load_entry,
)
from kernelarc.guard.build_cpp import (
    CudaCppBuilder,
    arch_name,
    gencode_flag,
    names_arch,
)
from kernelarc.problem.schema import CPP_LANGUAGES, Language, Solution


def make_solution(
    sources: dict[str, str],
    entry: str,
    languages: tuple[str, ...] = ("pytorch",),
    compile_options: dict[str, Any] | None = None,
    name: str = "sol",
) -> Solution:
    spec: dict[str, Any] = {"languages": list(languages), "entry_point": entry}
    if compile_options is not None:
        spec["compile_options"] = compile_options
    return Solution.model_validate(
        {
            "name": name,
            "definition": "test_def",
            "author": "tests",
            "spec": spec,
            "sources": [{"path": p, "content": c} for p, c in sources.items()],
        }
    )


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Give load_entry its own sys.path and forget the solution modules a test imported."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("ka_"):  # solutions (ka_sol_*) and their siblings (ka_t_*)
            del sys.modules[name]


def build_py(solution: Solution, tmp_path: Path) -> BuildArtifact:
    return PythonBuilder().build(
        solution, work_dir=tmp_path / "work", cache_dir=tmp_path / "cache", timeout=10
    )


# ------------------------------------------------------------------------------ python


def test_python_builder_stages_every_file(tmp_path: Path) -> None:
    sol = make_solution(
        {"kernel.py": "def run(x):\n    return x\n", "pkg/deep/util.py": "K = 1\n", "a.txt": "hi"},
        "kernel.py::run",
    )
    art = build_py(sol, tmp_path)
    assert art.builder == "python" and not art.cached
    assert art.root == tmp_path / "work" / sol.content_hash()
    assert art.module_path == art.root / "kernel.py"
    assert art.module_name == "ka_sol_" + sol.content_hash()[:12]
    assert art.symbol == "run" and art.content_hash == sol.content_hash()
    for src in sol.sources:
        assert (art.root / src.path).read_text() == src.content
    # Re-staging removes anything that is not a source (e.g. left by an earlier run).
    (art.root / "stray.py").write_text("x = 1\n")
    (art.root / "pkg" / "__pycache__").mkdir()
    build_py(sol, tmp_path)
    assert not (art.root / "stray.py").exists()
    assert not (art.root / "pkg" / "__pycache__").exists()
    assert (art.root / "pkg" / "deep" / "util.py").is_file()


def test_python_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    sol = make_solution(
        {"kernel.py": "def run(x):\n    return x\n", "helpers.py": "a = 1\nb = 2\ndef f(:\n"},
        "kernel.py::run",
    )
    with pytest.raises(BuildError) as info:
        build_py(sol, tmp_path)
    assert "helpers.py:3" in str(info.value)
    assert "SyntaxError" in info.value.log


def test_python_entry_must_be_a_py_file(tmp_path: Path) -> None:
    sol = make_solution({"kernel.cu": "int x;"}, "kernel.cu::run", ("triton",))
    with pytest.raises(BuildError, match="not a .py file"):
        build_py(sol, tmp_path)


def test_load_entry_single_file(tmp_path: Path, clean_imports: None) -> None:
    sol = make_solution({"k.py": "def run(a, b):\n    return a * 10 + b\n"}, "k.py::run")
    fn = load_entry(build_py(sol, tmp_path))
    assert fn(4, 2) == 42
    assert fn.__module__ == "ka_sol_" + sol.content_hash()[:12]


def test_load_entry_imports_siblings(tmp_path: Path, clean_imports: None) -> None:
    sol = make_solution(
        {
            "main.py": (
                "from ka_t_helpers import scale\n"
                "from ka_t_pkg.inner import offset\n"
                "def run(x):\n    return scale(x) + offset()\n"
            ),
            "ka_t_helpers.py": "def scale(x):\n    return 3 * x\n",
            "ka_t_pkg/__init__.py": "",
            "ka_t_pkg/inner.py": "def offset():\n    return 7\n",
        },
        "main.py::run",
    )
    fn = load_entry(build_py(sol, tmp_path))
    assert fn(5) == 22


def test_load_entry_missing_or_bad_symbol(tmp_path: Path, clean_imports: None) -> None:
    src = {"k.py": "VALUE = 3\ndef other():\n    return 1\n"}
    with pytest.raises(BuildError, match=r"'run' is not defined in k.py.*other"):
        load_entry(build_py(make_solution(src, "k.py::run"), tmp_path))
    with pytest.raises(BuildError, match="'VALUE' in k.py is a int, not a function"):
        load_entry(build_py(make_solution(src, "k.py::VALUE"), tmp_path))


def test_load_entry_import_error_carries_traceback(tmp_path: Path, clean_imports: None) -> None:
    sol = make_solution({"k.py": "import math\nx = 1 / 0\ndef run():\n    pass\n"}, "k.py::run")
    art = build_py(sol, tmp_path)
    with pytest.raises(BuildError, match="ZeroDivisionError") as info:
        load_entry(art)
    assert "k.py" in info.value.log and "line 2" in info.value.log
    assert art.module_name not in sys.modules


def test_load_entry_missing_module_file(tmp_path: Path) -> None:
    art = BuildArtifact("python", tmp_path, tmp_path / "gone.py", "ka_sol_x", "run", "h")
    with pytest.raises(BuildError, match="does not exist"):
        load_entry(art)


# ------------------------------------------------------------------------------ choice


@pytest.mark.parametrize("lang", list(Language), ids=lambda lang: lang.value)
def test_choose_builder_for_each_language(lang: Language) -> None:
    entry = "k.cu::run" if lang in CPP_LANGUAGES else "k.py::run"
    sol = make_solution({entry.split("::")[0]: "x"}, entry, (lang.value,))
    if lang in CPP_LANGUAGES:
        assert isinstance(choose_builder(sol), CudaCppBuilder)
        return
    package = PYTHON_LANGUAGE_PACKAGES[lang]
    try:
        available = importlib.util.find_spec(package) is not None
    except ImportError:
        available = False
    if available:
        assert isinstance(choose_builder(sol), PythonBuilder)
    else:
        with pytest.raises(BuildError, match=lang.value) as info:
            choose_builder(sol)
        assert repr(package) in info.value.log and "not installed" in info.value.log


def test_choose_builder_without_a_match() -> None:
    sol = make_solution({"k.cu": "x"}, "k.cu::run", ("cuda_cpp", "cublas"))
    with pytest.raises(BuildError) as info:
        choose_builder(sol, [PythonBuilder()])
    msg = str(info.value)
    assert "cuda_cpp, cublas" in msg and "builders tried: python" in msg
    assert all(lang.value in msg for lang in Language)
    with pytest.raises(BuildError, match="builders tried: none"):
        choose_builder(sol, [])
    assert [b.name for b in builders()] == ["python", "cuda_cpp"]


def test_cpp_entry_must_be_compiled_source() -> None:
    sol = make_solution({"k.h": "int x;"}, "k.h::run", ("cuda_cpp",))
    assert "not a compiled source" in (CudaCppBuilder().why_not(sol) or "")


# ------------------------------------------------------------------------------ arch flags


def test_arch_flags() -> None:
    assert arch_name("9.0") == "9.0a" and arch_name("8.0") == "8.0"
    assert gencode_flag("9.0a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert names_arch(["-O3", "-arch=sm_80"]) and not names_arch(["-O3", "--use_fast_math"])
    cu = make_solution({"k.cu": "x"}, "k.cu::run", ("cuda_cpp",))
    plan = CudaCppBuilder(cuda_capabilities=["9.0"]).plan(cu)
    assert plan.cuda_cflags == ["-O3", "--use_fast_math", "-gencode=arch=compute_90a,code=sm_90a"]
    assert plan.arch_list == "9.0a"
    own = make_solution({"k.cu": "x"}, "k.cu::run", ("cuda_cpp",), {"cuda_cflags": ["-arch=sm_80"]})
    plan = CudaCppBuilder(cuda_capabilities=["9.0"]).plan(own)
    assert plan.cuda_cflags == ["-arch=sm_80"] and plan.arch_list is None
    cpp = make_solution({"k.cpp": "x"}, "k.cpp::run", ("cuda_cpp",))
    plan = CudaCppBuilder(cuda_capabilities=["9.0"]).plan(cpp)
    assert plan.arch_list is None and not names_arch(plan.cuda_cflags)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_gencode_flag_compiles_with_nvcc(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text("__global__ void add1(float* x) { x[threadIdx.x] += 1.0f; }\n")
    flag = gencode_flag(arch_name("9.0"))
    done = subprocess.run(
        ["nvcc", "-c", flag, str(src), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "k.o").stat().st_size > 0


# ------------------------------------------------------------------------------ C++ builds

# torch/python.h: torch/extension.h less the C++ frontend's torch/all.h (nn, optim, ...),
# from the same include directory (the tensor type, pybind11 and its casters), a third less
# to compile.
ADD_CPP = """#include <torch/python.h>
#include "inc/offset.h"
torch::Tensor add_offset(torch::Tensor x) { return x + kOffset; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_offset", &add_offset); }
"""
NO_LINK = {"cflags": ["-O0"], "ld_flags": []}  # no -lcuda: this machine may have no driver


def add_solution() -> Solution:
    return make_solution(
        {"add.cpp": ADD_CPP, "inc/offset.h": "constexpr float kOffset = 2.5f;\n"},
        "add.cpp::add_offset",
        ("cuda_cpp",),
        NO_LINK,
    )


def build_cpp(sol: Solution, root: Path, timeout: float = 110) -> BuildArtifact:
    return CudaCppBuilder().build(
        sol, work_dir=root / "work", cache_dir=root / "cache", timeout=timeout
    )


@pytest.fixture(scope="module")
def built_cpp(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildArtifact, Path]:
    root = tmp_path_factory.mktemp("cpp_ok")
    return build_cpp(add_solution(), root), root


def test_cpp_build_and_load(built_cpp: tuple[BuildArtifact, Path], clean_imports: None) -> None:
    art, root = built_cpp
    sol = add_solution()
    assert art.builder == "cuda_cpp" and not art.cached
    assert art.module_name == "ka_sol_" + sol.content_hash()[:12]
    assert art.module_path == art.root / f"{art.module_name}.so"
    assert art.root == root / "work" / sol.content_hash()
    assert (art.root / "inc" / "offset.h").is_file()
    assert (root / "cache" / "cpp" / sol.content_hash() / "ok.json").is_file()
    fn = load_entry(art)
    assert torch.equal(fn(torch.zeros(3)), torch.full((3,), 2.5))


def test_cpp_cache_hit(built_cpp: tuple[BuildArtifact, Path], tmp_path: Path) -> None:
    first, root = built_cpp
    marker = root / "cache" / "cpp" / first.content_hash / "ok.json"
    stamp = marker.stat().st_mtime_ns
    start = time.monotonic()
    again = CudaCppBuilder().build(
        add_solution(), work_dir=tmp_path / "w2", cache_dir=root / "cache", timeout=110
    )
    elapsed = time.monotonic() - start
    assert again.cached and elapsed < 3.0, elapsed  # a real build takes well over 10 s here
    assert marker.stat().st_mtime_ns == stamp
    assert again.module_path.read_bytes() == first.module_path.read_bytes()
    assert again.root == tmp_path / "w2" / first.content_hash
    assert "building" in again.log


def test_cpp_compile_error_is_reported_and_cached(tmp_path: Path) -> None:
    # No torch header, so the compiler fails in a second rather than after parsing libtorch.
    bad = "int twice(int x) {\n  return 2 * x\n}\n"
    sol = make_solution({"bad.cpp": bad}, "bad.cpp::twice", ("cuda_cpp",), NO_LINK)
    with pytest.raises(BuildError, match="compilation failed") as info:
        build_cpp(sol, tmp_path)
    assert "error" in str(info.value) and "bad.cpp" in str(info.value)
    assert "expected" in info.value.log and "bad.cpp:2" in info.value.log
    start = time.monotonic()
    with pytest.raises(BuildError, match="cached result") as again:
        build_cpp(sol, tmp_path)
    assert time.monotonic() - start < 2.0
    assert again.value.log == info.value.log


def _processes_mentioning(text: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if text in cmdline:
            found[int(proc.name)] = cmdline
    return found


def test_cpp_timeout_kills_the_build(tmp_path: Path) -> None:
    entry = str(tmp_path / "cache" / "cpp")
    seen: dict[int, str] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(_processes_mentioning(entry))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(BuildError, match=r"build timed out after 8 s"):
            build_cpp(add_solution(), tmp_path, timeout=8)
    finally:
        stop.set()
        watcher.join()
    compilers = [cmd for cmd in seen.values() if "kernelarc.guard.build_cpp" not in cmd]
    assert compilers, f"no compiler was running at the deadline; saw {list(seen.values())}"
    time.sleep(0.2)
    assert not _processes_mentioning(entry)
    cache_entry = tmp_path / "cache" / "cpp" / add_solution().content_hash()
    assert not (cache_entry / "ok.json").exists() and not (cache_entry / "fail.json").exists()


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-only torch message")
def test_cu_source_on_cpu_torch_is_a_clear_uncached_error(tmp_path: Path) -> None:
    sol = make_solution({"k.cu": "__global__ void k() {}\n"}, "k.cu::run", ("cuda_cpp",))
    with pytest.raises(BuildError, match="has no CUDA support"):
        build_cpp(sol, tmp_path)
    assert not (tmp_path / "cache" / "cpp" / sol.content_hash() / "fail.json").exists()


ADD_CU = """#include <torch/extension.h>
__global__ void add1_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
torch::Tensor add1(torch::Tensor x) {
  auto y = x.clone();
  int n = y.numel();
  add1_kernel<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n);
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add1", &add1); }
"""


@pytest.mark.gpu
def test_cu_extension_builds_for_local_gpu(tmp_path: Path, clean_imports: None) -> None:
    sol = make_solution({"add1.cu": ADD_CU}, "add1.cu::add1", ("cuda_cpp",))
    art = build_cpp(sol, tmp_path)
    major, minor = torch.cuda.get_device_capability()
    assert gencode_flag(arch_name(f"{major}.{minor}")) in art.log, art.log
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    assert torch.equal(load_entry(art)(x), x + 1)
