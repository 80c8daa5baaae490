"""The two ways a checkpoint can be refused, as the tool's exit codes tell them apart, and the
torch bridge's refusal of a file it cannot convert."""


class BadInput(Exception):
    """Not a checkpoint at all (no such path, no manifest): the tool exits 2."""


class Damaged(Exception):
    """A checkpoint whose bytes disagree with its manifest or its format: the tool exits 1."""

    def __init__(self, path, what):
        super().__init__("%s: %s" % (path, what))
        self.path = path


class BridgeError(Exception):
    """The torch bridge's one-line refusal, `<file>: <what>` (torch_bridge.py exits 2 with it)."""
