"""Find the candidate in a model's answer: the fenced code block that defines `class ModelNew`.

Models often show a snippet, then the full solution, or restate a fix at the end; the last block that defines
`ModelNew` is the answer they settled on, and a block without it (a usage example, a shell command) never is.
"""

from __future__ import annotations

import re

# An opening fence (``` or ~~~, three or more, optional info string), the body, and a closing fence of the same
# characters at least as long (CommonMark), each fence on its own line.
_FENCED = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[^\n`]*\n(?P<body>.*?)^[ \t]*(?P=fence)[`~]*[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_DEFINES_MODELNEW = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)


def code_blocks(response: str) -> list[str]:
    """Every closed fenced block of `response`, in order."""
    return [match.group("body") for match in _FENCED.finditer(response)]


def extract_code(response: str) -> str | None:
    """The last fenced block that defines `class ModelNew`; None when no block does."""
    for block in reversed(code_blocks(response)):
        if _DEFINES_MODELNEW.search(block):
            return block
    return None
