"""The one way gagar's YAML configs are checked: a declarative pydantic schema, one model per section.

`gagar train` (`trainer.config`) and `gagar sft train` (`sft.train`) both build on it. Everything is checked when
the file is loaded, before any model is built: unknown keys (a typo must not silently train with the default),
wrong types (YAML's `true` is not a number), ranges and rules across keys. Every message names the key
(`section.key: expected an integer, got 'x'`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message says where and how."""


class Section(BaseModel):
    # Unknown keys are errors; values are checked and converted when the file is loaded.
    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        """YAML's `true` is not a number (pydantic would take it as 1)."""
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if field is not None and field.annotation in (int, float) and isinstance(value, bool):
                    kind = "an integer" if field.annotation is int else "a number"
                    raise ValueError(f"{key}: expected {kind}, got {value!r}")
        return data


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true/false", "string": "a string",
               "list": "a list", "dict": "a mapping", "model": "a mapping"}


def _want(err: dict[str, Any]) -> str | None:
    """What a wrong-type or wrong-choice error expected, in words (None for other errors)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "literal_error":
        return f"one of {ctx.get('expected', '')}".replace("'", "")
    if kind == "int_from_float" or (kind.endswith(("_type", "_parsing")) and kind.split("_")[0] in _TYPE_WORDS):
        return _TYPE_WORDS[kind.split("_")[0]]
    return None


def _message(err: dict[str, Any]) -> str:
    """One pydantic error as `section.key: what is wrong`, in the words of a config file's users."""
    loc = ".".join(str(x) for x in err["loc"])
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        section, key = ".".join(str(x) for x in err["loc"][:-1]), err["loc"][-1]
        return f"{section or 'config'}: unknown key {key}"
    if kind == "missing":
        return f"{loc}: required, and missing"
    if kind == "literal_error":
        return f"{loc} must be {_want(err)}"
    if (want := _want(err)) is not None:
        return f"{loc}: expected {want}, got {got!r}"
    for op, word in (("greater_than_equal", ">="), ("greater_than", ">"), ("less_than_equal", "<="),
                     ("less_than", "<")):
        if kind == op:
            limit = next(iter(ctx.values()))
            return f"{loc} must be {word} {limit}, got {got!r}"
    if kind == "value_error":  # our validators' messages start with the key inside the section at `loc`
        text = str(ctx.get("error", err["msg"]))
        return f"{loc}.{text}" if loc else text
    return f"{loc}: {err['msg']}"


def _field_type(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The section model of field `name` (`X | None` unwrapped); None for a plain value."""
    ann = model.model_fields[name].annotation
    for arg in (getattr(ann, "__args__", None) or (ann,)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _key_path(model: type[BaseModel], loc: tuple) -> tuple[tuple, bool]:
    """The part of an error's `loc` that is keys (and list positions), and whether pydantic added more: the
    member of a union (`bf16: Literal["auto"] | bool` fails as `bf16.literal['auto']` and `bf16.bool`)."""
    node: type[BaseModel] | None = model
    for i, x in enumerate(loc):
        if isinstance(x, int) or (node is not None and x in node.model_fields):
            if not isinstance(x, int):
                node = _field_type(node, x)
            continue
        return tuple(loc[:i]), True
    return tuple(loc), False


def _messages(model: type[BaseModel], errors: list[dict[str, Any]]) -> list[str]:
    """One message per key; the failures of a union's members merged into one `expected A or B`."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    union: set[tuple] = set()
    for e in errors:
        path, tagged = _key_path(model, tuple(e["loc"]))
        groups.setdefault(path, []).append({**e, "loc": path})
        if tagged:
            union.add(path)
    out = []
    for path, errs in groups.items():
        if path not in union:
            out += [_message(e) for e in errs]
            continue
        wants = [_want(e) or e["msg"] for e in errs]
        out.append(f"{'.'.join(map(str, path))}: expected {' or '.join(wants)}, got {errs[0].get('input')!r}")
    return out


def validate(model: type[M], data: dict[str, Any]) -> M:
    """`data` checked against `model`; a `ConfigError` naming every key at fault (unknown keys: those of the
    first section that has any, with the keys allowed there)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        unknown: dict[str, list[str]] = {}
        for e in errors:
            if e["type"] == "extra_forbidden":
                unknown.setdefault(".".join(str(x) for x in e["loc"][:-1]), []).append(str(e["loc"][-1]))
        if unknown:
            section, keys = next(iter(unknown.items()))
            node: type[BaseModel] = model
            for part in section.split(".") if section else []:
                node = _field_type(node, part) or node
            raise ConfigError(f"{section or 'config'}: unknown key(s) {', '.join(sorted(keys))}; allowed: "
                              f"{', '.join(sorted(node.model_fields))}") from None
        raise ConfigError("; ".join(_messages(model, errors))) from None


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's top-level mapping; a `ConfigError` saying why it cannot be read."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {p}: the top level must be a mapping of sections")
    return data
