"""Errors that say what was wrong, with which input, and how to fix it.

The library raises these without knowing which node called it; the node layer prefixes its own
name (``VAEKitError.for_node``) so the message that reaches the ComfyUI user names the node too."""
from __future__ import annotations


class VAEKitError(ValueError):
    def __init__(self, problem: str, *, input: str | None = None, fix: str | None = None):
        self.problem, self.input, self.fix = problem, input, fix
        self.node: str | None = None
        super().__init__(self._text())

    def _text(self) -> str:
        parts = []
        if self.node:
            parts.append(f"{self.node}: ")
        if self.input:
            parts.append(f"input '{self.input}': ")
        parts.append(self.problem)
        if self.fix:
            parts.append(f" Fix: {self.fix}")
        return "".join(parts)

    def for_node(self, node: str, input: str | None = None) -> "VAEKitError":
        """The same error, naming the node (and the node's own name for the input)."""
        self.node = node
        if input:
            self.input = input
        self.args = (self._text(),)
        return self


class LoadError(VAEKitError):
    """A weights file that cannot be read, is unsafe, or is not a VAE we know."""


class InputError(VAEKitError):
    """A latent or image that does not fit the loaded VAE."""


class NonFiniteError(VAEKitError):
    """A decode or encode whose output has NaN/Inf values (never returned): names the likely cause."""
