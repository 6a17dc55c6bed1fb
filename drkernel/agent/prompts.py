"""The words the model sees: the task prompt of turn 1, and the feedback message after each judged turn.

Feedback is `drkernel.feedback.render` (verdict, error message and the candidate's own traceback lines, the first
mismatch, hack reasons in plain words, the speedup with its interval, coverage, top kernels), never a raw JSON dump:
a dump spends the context on fields the model cannot act on, and the paper's dumps grow without bound.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from drkernel.errors import UsageError
from drkernel.feedback import render
from drkernel.schema import EvalResult

FIRST_TURN = """\
You are given a PyTorch model. Write custom Triton kernels that replace its PyTorch operators so that it runs \
faster on the GPU, while computing the same outputs.

Here is the architecture to optimize:

```python
{reference}
```

Write a new architecture named `ModelNew` with the same constructor arguments and `forward` signature as `Model`, \
whose computation happens in your own `@triton.jit` kernels. Keep `get_inputs` and `get_init_inputs` unchanged \
(you need not repeat them). Answer with the complete code of `ModelNew`, its imports and its kernels in one \
```python code block.
"""

FEEDBACK = """\
Your kernel was evaluated:

{feedback}

Improve it: fix what failed, or make it faster if it was correct. Answer with the complete new code of \
`ModelNew` in one ```python code block.
"""

FORMAT_ERROR = """\
Your answer had no ```python code block that defines `class ModelNew`, so there was nothing to evaluate. Answer \
with the complete code of `ModelNew`, its imports and its kernels in one ```python code block.
"""


@dataclass
class PromptTemplates:
    """Overridable templates. `first_turn` takes {reference}; `feedback` takes {feedback}, the rendered result;
    `format_error` is the whole message after an answer without code. Feedback is cut to `max_feedback_chars`."""

    first_turn: str = FIRST_TURN
    feedback: str = FEEDBACK
    format_error: str = FORMAT_ERROR
    max_feedback_chars: int = 4000

    def __post_init__(self) -> None:
        if self.max_feedback_chars < 200:
            raise UsageError(f"max_feedback_chars must be at least 200, not {self.max_feedback_chars}")
        for name, placeholder in (("first_turn", "{reference}"), ("feedback", "{feedback}")):
            if placeholder not in getattr(self, name):
                raise UsageError(f"the {name} template must contain {placeholder}")

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplates:
        """Templates from a TOML file (multi-line strings read well there) or a .json file, whose keys are the field
        names; fields it omits keep their defaults."""
        path = Path(path)
        try:
            text = path.read_text()
            if path.suffix == ".json":
                data = json.loads(text)
            else:
                import tomllib  # Python 3.11+

                data = tomllib.loads(text)
        except ImportError as exc:
            raise UsageError(f"{path}: TOML templates need Python 3.11+; write them as a .json file") from exc
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError too
            raise UsageError(f"cannot read prompt templates from {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise UsageError(f"{path}: expected a table of templates, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{path}: unknown template key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)


def first_turn_prompt(reference: str, templates: PromptTemplates = PromptTemplates()) -> str:
    return _fill(templates.first_turn, "{reference}", reference.strip("\n"))


def feedback_prompt(
    result: EvalResult | None, code: str | None, templates: PromptTemplates = PromptTemplates()
) -> str:
    """The message that follows a judged answer; with no code (and so no result) it says what was expected."""
    if result is None:
        if code is not None:
            raise ValueError("a turn with code must have a result to give feedback on")
        text = templates.format_error
    else:
        room = templates.max_feedback_chars - len(templates.feedback) + len("{feedback}")
        text = _fill(templates.feedback, "{feedback}", render(result, max_chars=max(room, 100)))
    return text if len(text) <= templates.max_feedback_chars else text[: templates.max_feedback_chars - 4] + " ..."


def _fill(template: str, placeholder: str, value: str) -> str:
    """Substitute one placeholder literally: code and results are full of braces that str.format would trip on."""
    return template.replace(placeholder, value)
