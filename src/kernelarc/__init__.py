"""KernelArc: multi-agent GPU kernel optimisation around one deterministic benchmark guard.

Importing this package is cheap: torch, triton and SDKs are imported only where used.
"""

__version__ = "0.1.0"
