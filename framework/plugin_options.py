"""A plugin's options: read from its constructor, or declared as a dataclass.

Two ways to take options, both checked before anything is built:

- plain keyword arguments of `__init__` after the engine's positional ones (their names are
  read from the signature, and from the bases' when it passes `**options` on);
- typed options: the class sets `Options` to a dataclass whose fields (with defaults, and
  `metadata={"help": ...}`) are the options; the engine builds `Options(**given)`, values
  checked against the field types, and passes it as the keyword argument `options`. Such a
  dataclass is also a Hydra structured config (`OmegaConf.structured(cls.Options)`).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schedlab.config import ConfigError

_MISSING = "(required)"


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option a plugin takes: its name, type, default and help (for messages and
    `schedlab plugins --check`)."""

    name: str
    type: str
    default: str
    help: str = ""

    def __str__(self) -> str:
        typed = f"{self.name}: {self.type}" if self.type else self.name
        shown = f"{typed} = {self.default}" if self.default != _MISSING else typed
        return f"{shown} ({self.help})" if self.help else shown


def options_class(cls: type) -> type | None:
    """The dataclass of typed options a plugin class declares as `Options`, or None."""
    opts = getattr(cls, "Options", None)
    return opts if isinstance(opts, type) and dataclasses.is_dataclass(opts) else None


def option_specs(cls: type, num_positional: int, base: type | None) -> tuple[list[OptionSpec],
                                                                               bool]:
    """The options a plugin class takes. No state change.

    Returns:
        (the options, whether any name is accepted: a `**kwargs` that goes nowhere checked).
    """
    typed = options_class(cls)
    if typed is not None:
        hints = _hints(typed)
        return [OptionSpec(f.name, _type_name(hints.get(f.name, f.type)), _default(f),
                           str(f.metadata.get("help", "")))
                for f in dataclasses.fields(typed)], False
    return _signature_options(cls, num_positional, base)


def _signature_options(cls: type, num_positional: int,
                       base: type | None) -> tuple[list[OptionSpec], bool]:
    specs: list[OptionSpec] = []
    passed_on = False  # a subclass took `**kwargs`: perhaps to read them itself
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return specs, passed_on
        try:
            params = list(inspect.signature(init).parameters.values())[1:]  # drop self
        except (TypeError, ValueError):
            return specs, True
        positional = 0
        var_keyword = False
        for p in params:
            if p.kind is p.VAR_KEYWORD:
                var_keyword = True
            elif p.kind is p.POSITIONAL_ONLY or (
                    p.kind is p.POSITIONAL_OR_KEYWORD and positional < num_positional):
                positional += 1
            elif (p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and all(s.name != p.name for s in specs)):
                annotation = "" if p.annotation is p.empty else str(p.annotation)
                default = _MISSING if p.default is p.empty else repr(p.default)
                specs.append(OptionSpec(p.name, annotation, default))
        if klass is base and var_keyword:
            # NOTE: the interfaces' own `**options` (queue, prefix cache) only refuse options
            return specs, False
        if not var_keyword:
            return specs, passed_on
        passed_on = True
    return specs, True


def constructor_options(kind: str, cls: type, given: Mapping[str, Any], label: str,
                        num_positional: int, base: type | None) -> dict[str, Any]:
    """The keyword arguments to build the plugin with: `given` itself for a plain
    constructor, `{"options": Options(**given)}` for typed options. No state change.

    Raises:
        ConfigError: an option the plugin does not take (the message lists those it takes), a
            value of the wrong type, or one its `Options` refuses.
    """
    specs, open_ = option_specs(cls, num_positional, base)
    unknown = [k for k in given if all(s.name != k for s in specs)]
    if unknown and not open_:
        accepted = (f"accepted options: {'; '.join(map(str, specs))}" if specs
                    else f"{cls.__qualname__} takes no options")
        raise ConfigError(f"{kind} {label} has no option {unknown[0]!r} "
                          f"({kind}_options / {kind}.options); {accepted}")
    typed = options_class(cls)
    if typed is None:
        return dict(given)
    hints = _hints(typed)
    for key, value in given.items():
        hint = hints.get(key)
        if hint is not None and not _matches(value, hint):
            raise ConfigError(f"{kind} {label} option {key}={value!r} must be "
                              f"{_type_name(hint)}")
    try:
        return {"options": typed(**given)}
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{kind} {label} options {dict(given)}: {e}") from None


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return _MISSING


def _hints(typed: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(typed)
    except (NameError, TypeError):  # an annotation that cannot be resolved: no type checks
        return {}


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and typing.get_origin(hint) is None:
        return hint.__name__
    return str(hint).replace("typing.", "")


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` fits the type `hint` (the shapes a YAML or Python value takes: scalars,
    None, unions, Literal, lists and mappings; any other hint passes)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    target = origin if origin is not None else hint
    if target is tuple:
        target = list | tuple  # YAML has lists only
    return isinstance(value, target) if isinstance(target, type | types.UnionType) else True
