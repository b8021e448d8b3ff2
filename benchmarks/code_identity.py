"""Which code made a row of ``benchmarks/optimizer_bench.py`` (its commit, the git trees of what
decides its figures, and a hash of those files' content), and whether merged rows are one
code. Used by that script; kept apart so that it stays one screen of benchmark logic."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: What decides a row's figures: the package and the benchmark script. Rows whose trees are equal
#: were made by the same code, even from different commits (a commit of docs between calls).
CODE_PATHS = ("src", "benchmarks/optimizer_bench.py")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def code_tree(commit: str = "HEAD") -> str | None:
    """A hash of ``CODE_PATHS`` as committed in ``commit`` (git's object ids, hashed
    together), or None when git cannot tell (not a checkout, unknown commit)."""
    import hashlib

    ids = []
    for path in CODE_PATHS:
        try:
            out = _git("rev-parse", f"{commit}:{path}")
        except OSError:
            return None
        if out.returncode != 0:
            return None
        ids.append(out.stdout.strip())
    return hashlib.sha256(" ".join(ids).encode()).hexdigest()[:12]


def code_version() -> str:
    """The commit the benchmark runs (``+dirty`` with uncommitted changes to tracked files),
    or why it is unknown: rows of one table must come from one version of the code."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except OSError as e:
        return f"unknown ({e})"
    if head.returncode != 0:
        return f"unknown (not a git checkout: {head.stderr.strip()[:200]})"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def code_tree_version() -> str:
    """:func:`code_tree` of HEAD, ``+dirty`` when ``CODE_PATHS`` have uncommitted changes."""
    tree = code_tree()
    if tree is None:
        return "unknown"
    try:
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    except OSError:
        return "unknown"
    return tree + ("+dirty" if dirty.stdout.strip() else "")


def code_content() -> str:
    """What ``CODE_PATHS`` hold in this working tree, read from the files themselves:
    ``src:<sha1> script:<sha1>``, the first the SHA-1 (12 hex digits) of every ``*.py`` under
    ``src`` concatenated in the byte order of their paths (what ``find src -name '*.py' |
    LC_ALL=C sort | xargs cat | sha1sum`` prints), the second of the benchmark script. No git:
    a copy of the tree may carry the ``.git`` of an older commit, which would make every row
    read ``+dirty`` so that no two rows could be told to be one code."""
    import hashlib

    src = hashlib.sha1()
    files = sorted((ROOT / "src").rglob("*.py"), key=lambda p: str(p.relative_to(ROOT)).encode())
    for path in files:
        src.update(path.read_bytes())
    script = hashlib.sha1((ROOT / CODE_PATHS[1]).read_bytes())
    return f"src:{src.hexdigest()[:12]} script:{script.hexdigest()[:12]}"


def _row_tree(r: dict[str, Any]) -> str:
    """A row's code tree: recorded, or worked out from its commit (rows made before the tree
    was recorded) when this checkout has that commit; "unknown (...)" otherwise."""
    if "code_tree" in r:
        return str(r["code_tree"])
    commit = str(r.get("code", ""))
    if not commit or commit.startswith("unknown"):
        return "unknown (no commit recorded)"
    if commit.endswith("+dirty"):
        return f"unknown ({commit}: uncommitted changes)"
    return code_tree(commit) or f"unknown ({commit} not in this checkout)"


def report_versions(results: dict[str, Any]) -> None:
    """Print the rows' commits, trees and contents, and a warning unless they are one code."""
    versions = sorted({str(r.get("code", "unrecorded")) for r in results.values()})
    print(f"code versions: {', '.join(versions)}")
    trees = sorted({_row_tree(r) for r in results.values()})
    print(f"code trees ({', '.join(CODE_PATHS)}): {', '.join(trees)}")
    contents = sorted({str(r.get("code_content", "unrecorded")) for r in results.values()})
    print(f"code contents: {', '.join(contents)}")
    if contents and "unrecorded" not in contents:
        one = len(contents) == 1  # read from the files: decides where every row has one
    else:
        one = len(trees) <= 1 and not any(
            t.startswith("unknown") or t.endswith("+dirty") for t in trees
        )
    if not one:
        print("--merge: the rows do not come from one known version of the code")
