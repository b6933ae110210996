"""pydantic errors rendered as the key path a user wrote and what is allowed there."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from edgereg.config._base import _RULE_ERROR
from edgereg.config._config import Config
from edgereg.errors import ConfigError
from edgereg.protocol.fields import NAME_RULE
from edgereg.protocol.patterns import NAME, SHA256


def _config_error(exc: ValidationError, data: Mapping[str, Any], file: str) -> ConfigError:
    problems = []
    for error in exc.errors():
        key_path = _key_path(error["loc"], data)
        if error["type"] == _RULE_ERROR:
            key_path = ".".join(part for part in (key_path, error["ctx"]["key"]) if part)
        elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            tag_key = error["ctx"]["discriminator"].strip("'")
            key_path = ".".join(part for part in (key_path, tag_key) if part)
        problems.append((key_path, _describe(error, key_path, data)))
    if len(problems) == 1:
        key_path, message = problems[0]
        return ConfigError(message, file=file, key_path=key_path or None)
    body = "\n".join(f"  {key or '(top level)'}: {message}" for key, message in problems)
    return ConfigError(f"{len(problems)} problems\n{body}", file=file)


def _key_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Turn a pydantic error location into the dotted path a user wrote.

    Union tags and validator names that pydantic puts into locations are not
    keys of the document; walking the document alongside drops them.
    """
    parts: list[str] = []
    node = data
    for item in loc:
        if item == "[key]":
            # pydantic's marker for a dict key that failed validation: the key
            # itself, already in the path, is what is wrong.
            continue
        if isinstance(node, Mapping) and isinstance(item, str) and item in node:
            node = node[item]
            parts.append(item)
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            node = node[item]
            parts.append(str(item))
        elif (
            isinstance(node, Mapping)
            and isinstance(item, str)
            and parts[-1:] != [item]
            and item == loc[-1]
        ):
            # A missing or unknown key: the last element names it.
            parts.append(item)
    return ".".join(parts)


#: Keys of earlier releases and where their setting lives now.
MOVED_KEYS = {
    "max_accuracy_drop": "write metrics.accuracy = { max_drop = N } in the budgets table",
    "max_class_recall_drop": "write metrics.class_recall_drop = { max = N } in the budgets table",
}


def _describe(error: Any, key_path: str, data: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden" and key_path.rsplit(".", 1)[-1] in MOVED_KEYS:
        return f"this key moved: {MOVED_KEYS[key_path.rsplit('.', 1)[-1]]}"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(key_path.split(".")[:-1], data)
        listed = ", ".join(allowed) if allowed else "none"
        return f"unknown key; allowed keys here: {listed}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        ctx = error["ctx"]
        key = ctx["discriminator"].strip("'")
        return f"unknown {key} '{ctx['tag']}'; allowed: {ctx['expected_tags']}"
    if kind == "union_tag_not_found":
        tags = ", ".join(repr(tag) for tag in _union_tags(key_path.split(".")[:-1], data))
        return f"required key is missing; allowed: {tags}"
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        if SHA256 in pattern:
            return "must be a sha256: 64 lowercase hex characters (run `sha256sum FILE`)"
        if NAME in pattern:
            return f"'{error['input']}' is not a valid name: {NAME_RULE}"
        if key_path.endswith(".evaluator"):
            return (
                f"'{error['input']}' is not module:function (a dotted module path, a colon, "
                "a function name, e.g. 'evals.ocr:score')"
            )
        return f"'{error['input']}' is not a version like 3.6.1"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _allowed_keys(parts: list[str], data: Mapping[str, Any]) -> list[str]:
    """Keys the schema allows at a dotted path (for 'unknown key' errors)."""
    node = _annotation_at(parts, data)
    if node is None:
        return []
    node = _unwrap(node)
    if typing.get_origin(node) in (Union, types.UnionType):
        # A tagged union whose tag is missing or unknown: any member's keys.
        members = typing.get_args(node)
        return list(dict.fromkeys(key for member in members for key in member.model_fields))
    if isinstance(node, type) and issubclass(node, BaseModel):
        return _keys(node)
    return []


def _keys(model: type[BaseModel]) -> list[str]:
    """A table's keys as models.toml spells them (a field's alias where it has one: ``try``)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def _union_tags(parts: list[str], data: Mapping[str, Any]) -> list[str]:
    """The values of the tag key a tagged union at a dotted path accepts."""
    node = _unwrap(_annotation_at(parts, data))
    tags: list[str] = []
    if typing.get_origin(node) in (Union, types.UnionType):
        for member in typing.get_args(node):
            field = member.model_fields.get("mode")
            if field is not None:
                tags.extend(typing.get_args(field.annotation))
    return tags


def _annotation_at(parts: list[str], data: Any) -> Any:
    """The schema annotation at a dotted path, or None when the schema has no such key.

    The document is walked alongside, so a tagged union resolves to the member
    its tag (``mode``) selects.
    """
    node: Any = Config
    for part in parts:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            data = None
        node = _step(node, part)
        if node is None:
            return None
        node = _select_member(node, data)
    return node


def _select_member(annotation: Any, value: Any) -> Any:
    """For a tagged union, the member whose ``mode`` literal matches ``value``."""
    node = _unwrap(annotation)
    if typing.get_origin(node) not in (Union, types.UnionType) or not isinstance(value, Mapping):
        return annotation
    for member in typing.get_args(node):
        field = getattr(member, "model_fields", {}).get("mode")
        if field is not None and value.get("mode") in typing.get_args(field.annotation):
            return member
    return annotation


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _step(node: Any, part: str) -> Any:
    node = _unwrap(node)
    origin = typing.get_origin(node)
    if origin is dict:
        return typing.get_args(node)[1]
    if origin is list:
        return typing.get_args(node)[0] if part.isdigit() else None
    if origin in (Union, types.UnionType):
        # A tagged union (quantization): the tag picks the member.
        for member in typing.get_args(node):
            field = getattr(member, "model_fields", {}).get(part)
            if field is not None:
                return field.annotation
        return None
    if isinstance(node, type) and issubclass(node, BaseModel):
        fields = {field.alias or name: field for name, field in node.model_fields.items()}
        field = fields.get(part)
        return field.annotation if field else None
    return None
