"""The tunables finder and rewriter (``kernelarc.proposers.tunables``) and the tuner's move
set, on realistic Triton sources (``tests/data/tuner/sources.py``).

Covered: tunable discovery (a grouped matmul with BLOCK_M/N/K, GROUP_M, num_warps,
num_stages and a grid of ``cdiv`` literals; autotune config lists, inline and module-level;
an elementwise kernel with a ``tl.constexpr`` BLOCK_SIZE constant; RMSNorm kernels with ROWS
rows per program), shape-computed values left alone, ambiguous grid links fixed; rewrites
that still parse and differ from the original in the chosen literals only (token by token);
autotune pinning; rewrite errors; neighbours, bounds and moves.

Not covered: running the rewritten kernels (test_tuner.py runs the RMSNorm ones under the
guard; the matmuls are only rewritten).
"""

from __future__ import annotations

import ast

import pytest
from data.tuner.sources import (
    AMBIGUOUS,
    AUTOTUNE,
    ELEMENTWISE,
    MATMUL,
    RMS_LITERAL,
    RMS_ROWS,
    SOURCES,
    differing_tokens,
    triton_solution,
)

from kernelarc.proposers.tunables import find_tunables, rewrite, solution_tunables
from kernelarc.proposers.tuner import moves_of, neighbours

# ------------------------------------------------------------------------------ discovery


def _keys(source: str, file: str) -> dict[str, tuple[str, int, int]]:
    """key -> (kind, value, number of spans)."""
    return {t.key: (t.kind, t.value, len(t.spans)) for t in find_tunables(source, file).params}


def test_matmul_tunables_and_grid_links() -> None:
    launch = "mm.py::launch:_matmul#0:"
    assert _keys(MATMUL, "mm.py") == {
        launch + "BLOCK_M": ("block", 128, 2),
        launch + "BLOCK_N": ("block", 64, 2),
        launch + "BLOCK_K": ("block", 32, 1),
        launch + "GROUP_M": ("group", 8, 1),
        launch + "num_warps": ("warps", 4, 1),
        launch + "num_stages": ("stages", 3, 1),
    }
    out = rewrite(MATMUL, "mm.py", {launch + "BLOCK_M": 256, launch + "BLOCK_N": 32})
    assert "grid = (triton.cdiv(M, 256) * triton.cdiv(N, 32),)  # one program per tile" in out
    assert "BLOCK_M=256, BLOCK_N=32, BLOCK_K=32, GROUP_M=8,  # tuned on H100" in out


def test_autotune_and_constants() -> None:
    keys = _keys(AUTOTUNE, "auto.py")
    site = "auto.py::autotune:_mm_splitk"
    assert keys[f"{site}[1]:SPLIT_K"] == ("split", 2, 1)
    assert keys[f"{site}[2]:num_stages"] == ("stages", 2, 1)
    assert keys["auto.py::autotune:_scale[0]:BLOCK_SIZE"] == ("block", 1024, 1)
    assert len([k for k in keys if k.startswith(site)]) == 3 * 5
    found = find_tunables(AUTOTUNE, "auto.py")
    assert [(s.key, len(s.configs)) for s in found.autotune] == [
        (site, 3),
        ("auto.py::autotune:_scale", 1),
    ]
    assert _keys(ELEMENTWISE, "ew.py") == {
        "ew.py::const:BLOCK_SIZE": ("block", 1024, 1),
        "ew.py::const:NUM_WARPS": ("warps", 4, 1),
    }, "HIDDEN is not a tunable name; the launch passes names, not literals"


def test_shape_computed_values_are_left_alone() -> None:
    assert _keys(RMS_ROWS, "rms.py") == {
        "rms.py::launch:_rms_rows#0:num_warps": ("warps", 4, 1),
        "rms.py::const:ROWS": ("rows", 2, 1),
    }, "BLOCK=triton.next_power_of_2(n_cols) is a constraint, not a literal"
    assert _keys(RMS_LITERAL, "rms.py") == {
        "rms.py::launch:_rms_rows#0:ROWS": ("rows", 2, 2),
        "rms.py::launch:_rms_rows#0:num_warps": ("warps", 4, 1),
    }
    out = rewrite(RMS_LITERAL, "rms.py", {"rms.py::launch:_rms_rows#0:ROWS": 8})
    assert "grid = (triton.cdiv(n_rows, 8),)" in out and "ROWS=8, num_warps=4" in out


def test_ambiguous_grid_link_fixes_the_tunables() -> None:
    found = find_tunables(AMBIGUOUS, "amb.py")
    assert [t.name for t in found.params] == ["num_warps"]
    assert len(found.fixed) == 2 and all("grid literal" in f for f in found.fixed)


@pytest.mark.parametrize("file", sorted(SOURCES))
def test_every_rewrite_parses_and_changes_only_the_chosen_literals(file: str) -> None:
    source = SOURCES[file]
    found = find_tunables(source, file)
    assert found.params
    for t in found.params:
        for new in neighbours(t.kind, t.value):
            out = rewrite(source, file, {t.key: new})
            ast.parse(out)
            assert differing_tokens(source, out) == [(str(t.value), str(new))] * len(t.spans)
            after = find_tunables(out, file).values()
            assert after == {**found.values(), t.key: new}


def test_pinning_an_autotune_list() -> None:
    site = "auto.py::autotune:_mm_splitk"
    out = rewrite(AUTOTUNE, "auto.py", pins={site: 1})
    ast.parse(out)
    assert out.count("triton.Config(") == 2  # the pinned one and _scale's
    assert (
        'CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT_K": 2}, '
        "num_warps=4, num_stages=4)]" in out
    )
    pinned = next(s for s in find_tunables(out, "auto.py").autotune if s.key == site)
    assert pinned.labels == ("BLOCK_M=64 BLOCK_N=128 SPLIT_K=2 num_warps=4 num_stages=4",)
    rest = AUTOTUNE[AUTOTUNE.index("@triton.autotune(configs=CONFIGS") :]
    assert out.endswith(rest), "everything after the list is unchanged"


def test_rewrite_errors() -> None:
    with pytest.raises(ValueError, match="no tunable"):
        rewrite(MATMUL, "mm.py", {"mm.py::launch:_matmul#0:BLOCK_X": 64})
    with pytest.raises(ValueError, match="positive int"):
        rewrite(MATMUL, "mm.py", {"mm.py::launch:_matmul#0:BLOCK_M": 0})
    with pytest.raises(ValueError, match="pinned"):
        rewrite(
            AUTOTUNE,
            "auto.py",
            {"auto.py::autotune:_mm_splitk[0]:BLOCK_M": 32},
            {"auto.py::autotune:_mm_splitk": 0},
        )
    with pytest.raises(ValueError, match="not within"):
        rewrite(AUTOTUNE, "auto.py", pins={"auto.py::autotune:_mm_splitk": 3})
    assert rewrite(MATMUL, "mm.py", {"other.py::const:BLOCK": 4}) == MATMUL


def test_neighbours_and_bounds() -> None:
    assert neighbours("warps", 4) == [8, 2]
    assert neighbours("warps", 16) == [8] and neighbours("warps", 1) == [2]
    assert neighbours("warps", 3) == [4, 2]
    assert neighbours("stages", 1) == [2] and neighbours("stages", 6) == [5]
    assert neighbours("block", 16) == [32] and neighbours("block", 8192) == [4096]
    assert neighbours("block", 8) == [16], "a base value below the bound widens it"
    assert neighbours("rows", 1) == [2] and neighbours("split", 3) == [6]


def test_moves_pin_multi_config_lists_and_tune_single_ones() -> None:
    moves = moves_of(triton_solution(AUTOTUNE))
    pins = [m for m in moves if m.kind == "pin"]
    assert [m.new for m in pins] == [0, 1, 2]
    assert "pinned to config 2/3 (BLOCK_M=64 BLOCK_N=128 SPLIT_K=2" in pins[1].label
    sets = {m.key for m in moves if m.kind == "set"}
    assert sets == {"rms.py::autotune:_scale[0]:BLOCK_SIZE", "rms.py::autotune:_scale[0]:num_warps"}
    bad = triton_solution("def run(:\n")
    assert moves_of(bad) == [] and "does not parse" in solution_tunables(bad).fixed[0]
