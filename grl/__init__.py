"""GRL: multi-turn reinforcement learning for language-model agents.

Importing this package is cheap on purpose: torch, ray and vllm are imported
by the modules that use them, so tools and env tests start fast.
"""

__version__ = "0.1.0"
