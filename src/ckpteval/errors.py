"""The one exception type for mistakes a user can fix.

A `UserError` carries one line of text that names the file or config key at fault and what to do.
The CLI and the workflow's scripts print it without a traceback; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's config, files or command line, explained in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
