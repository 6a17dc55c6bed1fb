"""Command-line options made from config dataclasses, TRL's way: a setting's type, default and help are written once,
on its field (`field(default=..., metadata={"help": ...})`), and a command names the fields it offers.

Field metadata: "help" (the sentence shown), "flag" (the option's name when it is not the field's, e.g. "--trials";
for a bool both names, "--perf/--no-perf"), "default_text" (what the default means, where showing it says little),
"min"/"max" and "choices". Every option is unset unless given, so a command receives only the settings named on
its command line (nested as the configs are: {"evaluation": {"device": "cpu"}}) and the config's defaults, or a
resumed run's saved settings, hold for the rest. Help shows each default as "(default: 5)": rich reads typer's own
"[default: 5]" as markup and drops it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import typer
from rich.markup import escape

from drkernel.cli.common import Command, parse_ids


@dataclass(frozen=True)
class Fields:
    """Fields of a config dataclass offered as options; `at` is where their settings go ("evaluation": the
    config's nested `evaluation`; "": its top level)."""

    config: type
    names: tuple[str, ...]
    at: str = ""


@dataclass(frozen=True)
class _Option:
    parameter: inspect.Parameter
    at: str
    name: str  # the field's
    flag: str
    ids: bool  # list[int]: given as '1,2' or '1-5'


def config_options(*groups: Fields) -> Callable[[Command], Command]:
    """Give `command` (which takes `settings: dict`) one option per field of `groups`; it is called with the
    settings given, nested by `Fields.at`."""
    options = [_option(group, name) for group in groups for name in group.names]

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            settings: dict[str, Any] = {}
            for option in options:
                value = kwargs.pop(option.parameter.name)
                if value is None or value == []:
                    continue
                value = value.value if isinstance(value, enum.Enum) else value
                place = settings.setdefault(option.at, {}) if option.at else settings
                place[option.name] = parse_ids(value, option.flag) if option.ids else value
            return command(settings=settings, **kwargs)

        own = [p for p in inspect.signature(command).parameters.values() if p.name != "settings"]
        run.__signature__ = inspect.Signature(own + [o.parameter for o in options])  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return decorate


def _option(group: Fields, name: str) -> _Option:
    spec = next(f for f in dataclasses.fields(group.config) if f.name == name)
    meta = spec.metadata
    kind = _unwrap(typing.get_type_hints(group.config)[name])
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    flag = meta.get("flag") or "--" + name.replace("_", "-")
    extra: dict[str, Any] = {k: meta[k] for k in ("min", "max") if k in meta}
    ids = kind == list[int]
    if kind is bool:
        if "/" not in flag:
            flag = f"{flag}/--no-{flag.removeprefix('--')}"
        annotation: Any = Optional[bool]
        extra["metavar"] = ""  # a flag takes no value: typer would show "<bool>"
        shown = flag.split("/")[0 if default else 1] if default is not dataclasses.MISSING else None
    elif "choices" in meta:
        choices = enum.Enum(name.title().replace("_", ""), {c: c for c in meta["choices"]})  # type: ignore[misc]
        annotation = Optional[choices]
        shown = default
    else:
        annotation = Optional[list[str]] if ids else Optional[kind]
        shown = default if default not in (dataclasses.MISSING, None, []) else None
    shown = meta.get("default_text", shown)
    text = meta.get("help", "") + (f" (default: {shown})" if shown is not None else "")
    parameter = inspect.Parameter(
        f"{group.at}__{name}" if group.at else name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
        default=typer.Option(None, flag, help=escape(text), show_default=False, **extra),
    )
    return _Option(parameter, group.at, name, flag.split("/")[0], ids)


def _unwrap(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint
