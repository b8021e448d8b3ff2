"""The built-in ``rewrite`` agent: torch.fx rewrites of the reference into fused library calls.

Modules: :mod:`.trace` (fx tracing, meta-tensor facts), :mod:`.graph` (matching helpers),
one module per rewrite family (:mod:`.casts`, :mod:`.norms`, :mod:`.activations`,
:mod:`.attention`), :mod:`.rewrites` (catalogue and pipeline), :mod:`.codegen` (plain
source), :mod:`.agent` (the ask/tell agent). Importing this package does not import torch.
"""

from kernelarc.proposers.rewrite.agent import RewriteAgent

__all__ = ["RewriteAgent"]
