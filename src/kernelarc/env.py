"""Every environment variable KernelArc reads, in one place.

Nothing else in the package reads ``os.environ`` for configuration. A value that is set but
malformed is an error naming the variable, never a silent fallback.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VAR = "KERNELARC_CACHE_DIR"
SHARED_PROBLEMS_VAR = "KERNELARC_PROBLEMS"
PROG_VAR = "KERNELARC_PROG"
DEFAULT_PROG = "kernelarc"

#: Patterns of parent environment variables a candidate must never see.
SECRET_PATTERNS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
#: Whole prefixes of LLM providers and clouds dropped from the candidate's environment.
SECRET_PREFIXES = (
    "OPENAI",
    "ANTHROPIC",
    "AZURE",
    "GOOGLE",
    "GEMINI",
    "MISTRAL",
    "COHERE",
    "GROQ",
    "TOGETHER",
    "DEEPSEEK",
    "HF_",
    "HUGGING",
    "AWS",
    "GCP",
    "OPENROUTER",
    "LITELLM",
    "FIREWORKS",
    "REPLICATE",
    "XAI",
    "PERPLEXITY",
    "VOYAGE",
)


def cache_dir() -> Path:
    """Where builds and measured device profiles are cached."""
    raw = os.environ.get(CACHE_DIR_VAR)
    if raw is not None:
        if not raw.strip():
            raise ValueError(f"{CACHE_DIR_VAR} is set but empty: unset it or give a directory")
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelarc"


def shared_problems() -> Path | None:
    """Optional root of a SOL-ExecBench problem tree (used by tests and benchmarks)."""
    raw = os.environ.get(SHARED_PROBLEMS_VAR)
    return Path(raw).expanduser() if raw else None


def prog() -> str:
    """How the user runs the CLI, for messages that name a command (``./ka`` sets
    ``KERNELARC_PROG``); ``kernelarc`` when unset."""
    raw = os.environ.get(PROG_VAR)
    if raw is None:
        return DEFAULT_PROG
    if not raw.strip():
        raise ValueError(f"{PROG_VAR} is set but empty: unset it or give the command's name")
    return raw.strip()


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(p in upper for p in SECRET_PATTERNS) or upper.startswith(SECRET_PREFIXES)


def parent_environment() -> dict[str, str]:
    """A copy of this process's environment (the one place that reads all of it)."""
    return dict(os.environ)
