"""Write the generated reference pages, so they cannot drift from the code.

- docs/reference/models-toml.md from ``edgereg.config.json_schema()``: every
  table, key, type, default, allowed values and description.
- docs/reference/cli.md from the click commands under ``edgereg.cli.main``:
  usage, help, arguments and options with their defaults.
- docs/reference/exit-codes.md from ``edgereg.errors.ExitCode``, with each
  code's long meaning from ``EXIT_CODE_ROWS`` below.
- the task kinds' tables in docs/models-toml.md (kinds and settings, metrics,
  default budgets) and docs/build.md (labels) from the specs in
  ``edgereg/tasks/``, between marker lines.

Run from anywhere, after changing edgereg/config/ or a command::

    python docs/gen/reference.py           # rewrite the pages
    python docs/gen/reference.py --check   # exit 1 when a committed page is stale

tests/test_docs.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]

# Keys the JSON Schema does not describe yet, keyed by (schema definition, key).
# The schema's own description wins: once a Field in edgereg/config/ gets a
# description, the generator asks for its entry here to be deleted, and it
# refuses entries for keys that no longer exist. Every sentence here must be
# true of edgereg/config/ and the build.
NOTES: dict[tuple[str, str], str] = {
    ("Config", "toolchain"): "Exact versions of the build tools; a DVC param of every stage, "
    "so changing a pin rebuilds everything.",
    ("Config", "registry"): "Where `edgereg publish` writes and `edgereg serve` reads.",
    ("Toolchain", "mnn"): "Exact version of the installed `mnn` package.",
    ("Toolchain", "onnx"): "Exact version of the installed `onnx` package.",
    ("Toolchain", "onnxruntime"): "Exact version of the installed `onnxruntime` package.",
    ("Tier", "description"): "Free text for people (reports, status).",
    ("Tier", "min_ram_mb"): "A device with less RAM (MB) does not match.",
    ("Tier", "min_cpu_cores"): "A device with fewer CPU cores does not match.",
    ("Tier", "os"): "Operating systems the tier accepts; a device that reports none "
    "does not match.",
    ("PinnedFile", "path"): "Path relative to models.toml, or a `file://` URI. Other URL "
    "schemes are refused: bring remote files into the repository first "
    "(`dvc import-url`).",
    ("PinnedFile", "sha256"): "sha256 of the file, 64 lowercase hex characters "
    "(`sha256sum FILE`). A build refuses a file that does not match.",
    ("CalibrationSet", "path"): "Path of the `.npz` set, relative to models.toml, or a "
    "`file://` URI.",
    ("CalibrationSet", "sha256"): "sha256 of the file (`sha256sum FILE`).",
    ("InputSpec", "name"): "The input's name in the ONNX graph.",
    ("InputSpec", "kind"): '`"image"`: the datasets hold uint8 pictures that edgereg '
    'converts, normalizes and lays out; `"tensor"`: samples exactly as the model takes them.',
    ("InputSpec", "layout"): "Image inputs only, and required for them.",
    ("InputSpec", "color"): "Channel order of an image input; image inputs only, and "
    "required for them.",
    ("InputSpec", "mean"): "Image inputs: subtracted from the pixel values, one value per channel.",
    ("InputSpec", "std"): "Image inputs: the pixel values are divided by it after "
    "subtracting `mean`, one value per channel.",
    ("OutputSpec", "name"): "The output's name in the ONNX graph.",
    ("Budgets", "max_size_mb"): "Largest artifact size, in MB (10^6 bytes).",
    ("NoQuantization", "mode"): "Selects this table.",
    ("WeightOnlyQuantization", "mode"): "Selects this table.",
    ("WeightOnlyQuantization", "bits"): "Bits per weight (converter `--weightQuantBits`).",
    ("WeightOnlyQuantization", "asymmetric"): "Asymmetric weight quantization "
    "(converter `--weightQuantAsymmetric`).",
    ("Int8Quantization", "mode"): "Selects this table.",
    ("Int8Quantization", "weight_method"): "How MNN's quantizer quantizes weights.",
    ("ConverterOptions", "transformer_fuse"): "Fuse transformer blocks (converter "
    "`--transformerFuse`).",
    ("ConverterOptions", "optimize_prefer"): "Converter `--optimizePrefer`.",
    ("VariantRuntime", "precision"): "MNN precision mode the app should ask for.",
    ("Variant", "tier"): "The tier this variant is for; a tier takes at most one variant of "
    "a model.",
    ("Variant", "precision"): '`"fp16"` stores weights as float16 (converter `--fp16`) and '
    "cannot be combined with quantization.",
    ("Variant", "quantization"): "How to quantize; one of three tables, chosen by `mode`.",
    ("Variant", "converter"): "Extra MNN converter options.",
    ("Variant", "runtime"): "Hints that travel with the variant to the app, and the settings "
    "devices try (`try`, decision 0008).",
    ("Variant", "budgets"): "Overrides the model's budgets key by key.",
    ("Variant", "calibration"): "This variant's own calibration set (for a variant with its "
    "own source).",
    ("Variant", "evaluation"): "This variant's own evaluation set (for a variant with its "
    "own source).",
    ("Model", "version"): "Semantic version (MAJOR.MINOR.PATCH) of the next release; "
    "`edgereg publish --version` overrides it.",
    ("Model", "description"): "Free text for people.",
    ("Model", "source"): "The ONNX model, pinned by sha256.",
    ("Model", "inputs"): "Every input of the graph.",
    ("Model", "outputs"): "Every output of the graph.",
    ("Model", "calibration"): "Calibration set; int8 variants need one here or in the variant.",
    ("Model", "evaluation"): "Evaluation set: every variant's outputs are compared with ONNX "
    "Runtime's on it and its task metrics scored; `labels` as the task reads them (required "
    "for classification).",
    ("Model", "budgets"): "Gates every variant must pass; a variant may override them.",
    ("Model", "variants"): "One build per tier, by variant name.",
}

PLACEHOLDERS = {
    "tiers": "<tier>",
    "models": "<model>",
    "variants": "<variant>",
    "metrics": "<metric>",
}

# A sentence after "One of these tables" for unions that also take a shorthand.
UNION_NOTES = {
    "task": 'A string is short for a table with only `kind`: `task = "embedding"` is '
    '`task = { kind = "embedding" }`. The metrics each kind measures, and their default '
    "budgets, are in the [models.toml guide](../models-toml.md#tasks-and-their-metrics).",
}


def _builtin_guardrails() -> list[str]:
    """The built-in guardrails, from their one table (edgereg/config/_guardrails.py)."""
    from edgereg.config import BUILTIN_GUARDRAILS

    rows = [
        [
            _code(spec.name),
            _escape(spec.reads),
            "rate: a share of devices, in points"
            if spec.test == "rate"
            else f"shift: one value per device ({spec.unit}), in % of the stable",
            _escape(spec.worse),
            "yes" if spec.critical else "no",
        ]
        for spec in BUILTIN_GUARDRAILS
    ]
    return [
        "The built-in guardrails, each one entry of `BUILTIN_GUARDRAILS` in "
        "`edgereg/config/_guardrails.py`; their keys and default limits are below. A key "
        "a guardrail's table leaves out takes that guardrail's default.",
        "",
        *_table(["guardrail", "report keys", "test", "worse", "critical by default"], rows),
    ]


# Tables written after a section's description, by schema definition.
SECTION_TABLES: dict[str, Callable[[], list[str]]] = {"Guardrails": _builtin_guardrails}

# A table still to document: (schema definition, its schema, TOML path, array of tables).
_Child = tuple[str, dict[str, Any], list[str], bool]


# --- text helpers ---------------------------------------------------------------------


def _escape(text: str) -> str:
    """Escape Markdown outside `code spans`, and pipes everywhere (table cells)."""
    parts = text.split("`")
    for index in range(0, len(parts), 2):  # the even parts are outside code spans
        for char in ("\\", "*", "_", "<", ">", "[", "]"):
            parts[index] = parts[index].replace(char, "\\" + char)
    return "`".join(parts).replace("|", "\\|").replace("\n", " ")


def _toml(value: Any) -> str:
    """A value as TOML would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def _code(text: str) -> str:
    return f"`{text}`"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# --- models.toml --------------------------------------------------------------------


class _SchemaPage:
    """Walks the JSON Schema depth first, one section per TOML table."""

    def __init__(self, schema: dict[str, Any], defaults: Callable[[str, str], Any]) -> None:
        self.schema = schema
        self.defs: dict[str, Any] = schema.get("$defs", {})
        self.defaults = defaults
        self.documented: dict[str, tuple[str, str]] = {}  # def name -> (title, anchor)
        self.used_notes: set[tuple[str, str]] = set()
        self.lines: list[str] = []

    def render(self) -> list[str]:
        self._section("Config", self.schema, [], array=False, title="Top level")
        unused = sorted(set(NOTES) - self.used_notes)
        if unused:
            raise SystemExit(
                f"docs/gen/reference.py: NOTES has entries for keys the schema does not have: "
                f"{unused}; delete them"
            )
        return self.lines

    # -- naming

    @staticmethod
    def _title(path: list[str], array: bool) -> str:
        dotted = ".".join(path)
        return f"[[{dotted}]]" if array else f"[{dotted}]"

    @staticmethod
    def _anchor(path: list[str]) -> str:
        words = [part.strip("<>") for part in path]
        return "-".join(words) or "top"

    def _deref(self, node: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        ref = node.get("$ref")
        if ref is None:
            return None, node
        name = ref.rsplit("/", 1)[-1]
        return name, self.defs[name]

    @staticmethod
    def _strip_null(node: dict[str, Any]) -> dict[str, Any]:
        options = node.get("anyOf")
        if options is None:
            return node
        rest = [option for option in options if option.get("type") != "null"]
        return rest[0] if len(rest) == 1 else {"anyOf": rest}

    # -- sections

    def _section(
        self,
        def_name: str,
        node: dict[str, Any],
        path: list[str],
        *,
        array: bool,
        title: str | None = None,
        level: int = 2,
    ) -> None:
        title = title or self._title(path, array)
        anchor = self._anchor(path)
        self.documented.setdefault(def_name, (title, anchor))
        shown = title if not path else _code(title)
        self.lines += ["", f"{'#' * level} {shown} {{#{anchor}}}", ""]
        if node.get("description"):
            self.lines += [_escape(node["description"]), ""]
        if def_name in SECTION_TABLES:
            self.lines += [*SECTION_TABLES[def_name](), ""]
        children: list[_Child] = []
        rows = []
        required = set(node.get("required", []))
        for key, prop in node.get("properties", {}).items():
            type_text, child = self._type(prop, [*path, key])
            if child is not None:
                children.append(child)
            rows.append(
                [
                    _code(key),
                    type_text,
                    self._default(def_name, key, prop, key in required),
                    self._description(def_name, key, prop),
                ]
            )
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and "$ref" in extra:
            # A table that takes tables of any other name (a guardrail on an app metric).
            extra_def, target = self._deref(extra)
            assert extra_def is not None
            text, child = self._table_link(extra_def, target, [*path, "<name>"], array=False)
            if child is not None:
                children.append(child)
            rows.append(
                [_code("<name>"), text + ", any other name", "—", _escape(target["description"])]
            )
        if rows:
            self.lines += _table(["key", "type", "default", "description"], rows)
        for child_def, child_node, child_path, child_array in children:
            if child_node.get("oneOf"):
                self._union_section(child_node, child_path)
            else:
                self._section(child_def, child_node, child_path, array=child_array)

    def _union_section(self, node: dict[str, Any], path: list[str]) -> None:
        anchor = self._anchor(path)
        tag = node["discriminator"]["propertyName"]
        self.lines += ["", f"## {_code(self._title(path, False))} {{#{anchor}}}", ""]
        self.lines += [f"One of these tables, chosen by `{tag}`.", ""]
        if path[-1] in UNION_NOTES:
            self.lines += [UNION_NOTES[path[-1]], ""]
        for option in node["oneOf"]:
            name, member = self._deref(option)
            assert name is not None
            value = member["properties"][tag]["const"]
            sub_path = [*path[:-1], f"{path[-1]}-{value}"]
            self._section(
                name,
                member,
                sub_path,
                array=False,
                title=f"{tag} = {_toml(value)}",
                level=3,
            )

    def _type(self, prop: dict[str, Any], path: list[str]) -> tuple[str, _Child | None]:
        """The type column, and the child table to document after this one, if any."""
        prop = self._strip_null(prop)
        unions = [option for option in prop.get("anyOf", []) if "oneOf" in option]
        if unions:
            # A string shorthand or a tagged table (task = "dense_map" or { kind = ... }).
            union = unions[0]
            others = [option for option in prop["anyOf"] if option is not union]
            anchor = self._anchor(path)
            shorthand = " or ".join(self._scalar(option) for option in others)
            tag = union["discriminator"]["propertyName"]
            return f"{shorthand}, or [table, by `{tag}`](#{anchor})", ("", union, path, False)
        if "oneOf" in prop:
            anchor = self._anchor(path)
            return f"[table, by `{prop['discriminator']['propertyName']}`](#{anchor})", (
                "",
                prop,
                path,
                False,
            )
        def_name, target = self._deref(prop)
        if def_name is not None:
            return self._table_link(def_name, target, path, array=False)
        kind = prop.get("type")
        if kind == "array":
            item_def, item = self._deref(prop["items"])
            if item_def is not None:
                text, child = self._table_link(item_def, item, path, array=True)
                return "array of " + text, child
            text = "array of " + self._scalar(item) + self._count(prop, "minItems", "item")
            return text, None
        by_name = prop.get("patternProperties") or (
            {"": prop["additionalProperties"]}
            if isinstance(prop.get("additionalProperties"), dict)
            else None
        )
        if kind == "object" and by_name:
            ((_pattern, value),) = by_name.items()
            placeholder = PLACEHOLDERS.get(path[-1], "<name>")
            value_def, target = self._deref(value)
            assert value_def is not None
            text, child = self._table_link(value_def, target, [*path, placeholder], array=False)
            text = text.replace("[table]", "[tables]", 1).replace("table,", "tables,", 1)
            return text + " by name" + self._count(prop, "minProperties", "table"), child
        return self._scalar(prop), None

    def _table_link(
        self, def_name: str, target: dict[str, Any], path: list[str], *, array: bool
    ) -> tuple[str, _Child | None]:
        if def_name in self.documented:
            title, anchor = self.documented[def_name]
            return f"table, keys as in [{_code(title)}](#{anchor})", None
        anchor = self._anchor(path)
        self.documented[def_name] = (self._title(path, array), anchor)
        return f"[table](#{anchor})", (def_name, target, path, array)

    @staticmethod
    def _count(node: dict[str, Any], key: str, noun: str) -> str:
        if key not in node:
            return ""
        count = node[key]
        return f" (at least {count} {noun}{'s' if count != 1 else ''})"

    def _scalar(self, node: dict[str, Any]) -> str:
        node = self._strip_null(node)
        if "const" in node:
            return _code(_toml(node["const"]))
        if "enum" in node:
            return "one of " + ", ".join(_code(_toml(value)) for value in node["enum"])
        if "anyOf" in node:
            return " or ".join(self._scalar(option) for option in node["anyOf"])
        kind = node.get("type", "any")
        words = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}
        text = words.get(kind, str(kind))
        bounds = []
        for key, sign in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
        ):
            if key in node:
                bounds.append(f"{sign} {_toml(node[key])}")
        if bounds:
            text += ", " + " and ".join(bounds)
        from edgereg.protocol.fields import SEMVER_PATTERN

        if node.get("pattern") == SEMVER_PATTERN:
            text = "semantic version " + text  # the SemVer 2.0 regex says less to a reader
        elif node.get("pattern"):
            text += " matching " + _code(node["pattern"])
        if node.get("minLength") == 1:
            text = "non-empty " + text
        return text

    def _default(self, def_name: str, key: str, prop: dict[str, Any], required: bool) -> str:
        if required:
            return "required"
        # pydantic leaves default_factory values out of the schema.
        value = prop["default"] if "default" in prop else self.defaults(def_name, key)
        if value is None or value == {}:
            return "—"
        return _code(_toml(value))

    def _description(self, def_name: str, key: str, prop: dict[str, Any]) -> str:
        text = prop.get("description")
        note = NOTES.get((def_name, key))
        if note is not None:
            self.used_notes.add((def_name, key))
            if text:
                raise SystemExit(
                    f"docs/gen/reference.py: the schema now describes {def_name}.{key}; "
                    f"delete NOTES[{(def_name, key)!r}]"
                )
            text = note
        if not text and key == "kind" and def_name in _task_tables():
            text = "Selects this table."  # the tag of every task kind's table
        return _escape(text or "")


def _task_tables() -> set[str]:
    """The schema definitions of the task kinds' tables (edgereg.tasks)."""
    from edgereg.tasks import TASK_CLASSES

    return {task.__name__ for task in TASK_CLASSES.values()}


def _factory_default(def_name: str, key: str) -> Any:
    """A key's default when pydantic left it out of the schema (a default_factory)."""
    from pydantic import BaseModel

    from edgereg import config

    model = getattr(config, def_name, None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    field = model.model_fields.get(key)
    if field is None or field.default_factory is None:
        return None
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        # A task default is written as its string shorthand; other tables have none.
        return getattr(value, "kind", None) if key == "task" else None
    return value


def models_toml_reference() -> str:
    """The models.toml reference page."""
    from edgereg.config import NAME_RULE, json_schema

    head = [
        "<!-- Generated by docs/gen/reference.py from edgereg.config.json_schema(); "
        "do not edit. Run: python docs/gen/reference.py -->",
        "",
        "# models.toml reference",
        "",
        "Every table and key `edgereg validate` accepts. Unknown keys are errors. "
        "`edgereg schema` prints the same JSON Schema, for editors.",
        "",
        f"Names of tiers, models and variants: {_escape(NAME_RULE)}. A default of — means "
        "unset. Rules that span several keys (one variant per tier, tier fallback, the "
        "catch-all tier, int8 needs a calibration set) are in the "
        "[models.toml guide](../models-toml.md).",
    ]
    body = _SchemaPage(json_schema(), _factory_default).render()
    return "\n".join(head + body) + "\n"


# --- CLI ----------------------------------------------------------------------------


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    import click

    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def _help_text(command: Any) -> str:
    """The help text as Markdown; a paragraph click keeps unwrapped becomes a code block."""
    text = inspect.cleandoc(command.help or "").split("\f", 1)[0]
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.splitlines()
        if lines and lines[0].strip() == "\b":
            block = inspect.cleandoc("\n".join(lines[1:]))
            paragraphs.append(f"```\n{block}\n```")
        else:
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs).strip()


def _param_type(param: Any, ctx: Any) -> str:
    import click

    if isinstance(param, click.Option) and param.is_flag and not param.count:
        return "flag"
    kind = param.type
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(_code(str(choice)) for choice in kind.choices)
    try:
        metavar = param.make_metavar(ctx)
    except TypeError:  # click < 8.2
        metavar = param.make_metavar()
    describe = getattr(kind, "_describe_range", None)
    text = _code(metavar)
    if describe is not None:
        text += f" {_code(describe())}"
    if getattr(param, "multiple", False):
        text += ", repeatable"
    return text


def _param_default(param: Any, ctx: Any) -> str:
    import click

    if param.required:
        return "required"
    default = param.get_default(ctx, call=False)
    if callable(default):
        return "computed"
    if default is None or type(default).__name__ == "Sentinel" or default == ():
        return "—"
    if isinstance(param, click.Option) and param.is_flag and default is False:
        return "—"
    return _code(str(default))


def cli_reference() -> str:
    """The command-line reference page."""
    import click

    from edgereg.cli import main

    lines = [
        "<!-- Generated by docs/gen/reference.py from the click commands; do not edit. "
        "Run: python docs/gen/reference.py -->",
        "",
        "# Command-line reference",
        "",
        "Every command takes `-h`/`--help`. Results go to stdout; progress, notes, warnings "
        "and errors to stderr. `-v`/`--verbose` (a traceback with an error), `-q`/`--quiet` "
        "(results and errors only) and `--json` (on commands that have it) work before or "
        "after the command: `edgereg -q status` and `edgereg status -q` are the same. "
        "Without `--config`, commands use the `models.toml` of the working directory or of "
        "the nearest parent folder, up to the repository root (the folder with `.git` or "
        "`.dvc`), as git and DVC find theirs; paths in it are relative to its own folder. "
        "What each exit status means: [exit codes](exit-codes.md).",
    ]
    root = click.Context(main, info_name="edgereg")
    for command, ctx in _commands(main, root):
        lines += ["", f"## {ctx.command_path}", ""]
        usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
        lines += ["```", usage, "```", ""]
        help_text = _help_text(command)
        if help_text:
            lines += [help_text, ""]
        help_option = command.get_help_option(ctx)
        params = [
            p
            for p in command.get_params(ctx)
            if p is not help_option and not getattr(p, "hidden", False)
        ]
        arguments = [p for p in params if isinstance(p, click.Argument)]
        options = [p for p in params if isinstance(p, click.Option)]
        if arguments:
            rows = [
                [_code(p.human_readable_name), "yes" if p.required else "no"] for p in arguments
            ]
            lines += [*_table(["argument", "required"], rows), ""]
        if options:
            rows = []
            for p in options:
                names = ", ".join(_code(opt) for opt in [*p.opts, *p.secondary_opts])
                help_cell = _escape(p.help or "")
                if p.envvar:
                    envvars = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar)
                    help_cell += " Environment: " + ", ".join(_code(e) for e in envvars) + "."
                rows.append([names, _param_type(p, ctx), _param_default(p, ctx), help_cell])
            lines += [*_table(["option", "type", "default", "description"], rows), ""]
        if isinstance(command, click.Group):
            rows = []
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is None or sub.hidden:
                    continue
                anchor = f"{ctx.command_path} {name}".replace(" ", "-")
                rows.append(
                    [f"[{_code(name)}](#{anchor})", _escape(sub.get_short_help_str(limit=300))]
                )
            lines += [*_table(["command", "what it does"], rows), ""]
        while lines[-1] == "":
            lines.pop()
    return "\n".join(lines) + "\n"


# --- exit codes: the table of edgereg.errors.ExitCode, each code's long meaning here -------

# The long form of each code's meaning, for docs/reference/exit-codes.md; the short one
# (`edgereg --help`) is ExitCode.meaning. A code missing here, or a row for a code that
# no longer exists, stops the generator.
EXIT_CODE_ROWS: dict[str, tuple[str, str]] = {
    "OK": (
        "success (also: nothing to do, already published, up to date)",
        "",
    ),
    "ERROR": (
        ("other error, the message says what; `edgereg dvc sync --check`: `dvc.yaml` is stale"),
        "",
    ),
    "USAGE": (
        (
            "bad `models.toml`, or bad command-line usage (an unknown option, `--canary "
            "150%`, `publish` without `--canary`/`--full`, `rollout` without "
            "`--to`/`--next`); `edgereg pull`: a `--tier` that `models.toml` does not "
            "declare, or a model or tier the registry has no manifest for (404, `not-found`)"
        ),
        "no: fix the input",
    ),
    "BUILD_FAILED": (
        (
            "a build stage failed: a tool crashed, an input is missing or of the wrong shape,"
            " the toolchain versions differ"
        ),
        "no: fix the input",
    ),
    "GATE_FAILED": (
        "a variant failed a gate: a budget was exceeded",
        "no: see [When a gate fails](../build.md#when-a-gate-fails)",
    ),
    "TRUST": (
        (
            "trust: a signature, key or signed document is not acceptable (bad or unknown-key"
            " signature, expired, rolled back, unsafe key file)"
        ),
        "never: the same bytes fail again",
    ),
    "STORAGE": (
        (
            "storage: the registry could not be read or written, or another publisher changed"
            " the rollout state first"
        ),
        (
            "usually: run the command again; not when the message says the store itself is "
            "unfit (it does not honour conditional writes, the registry directory or the "
            "bucket does not exist, access is denied, an entry is a link out of the registry)"
        ),
    ),
    "ROLLOUT_REFUSED": (
        (
            "a rollout command is not allowed in the current state (nothing to promote, soak "
            "time not over, version not newer)"
        ),
        "no: the message says what is allowed",
    ),
    "NOT_PUBLISHABLE": (
        (
            "the build outputs cannot be published: missing, stale against `models.toml`, or "
            "failed a gate; or the version is already published with other artifacts"
        ),
        "no: `dvc repro` first, or bump `version`",
    ),
    "VERIFY_FAILED": (
        "`edgereg verify` found problems",
        "",
    ),
    "UNREACHABLE": (
        (
            "`edgereg pull`: the registry could not be reached, answered with an error, was "
            "slower than `--min-rate`, or the pull passed `--deadline`"
        ),
        "yes",
    ),
    "CACHE": (
        (
            "`edgereg pull`: the client's cache directory could not be read or written, or "
            "its rollback-protection state is corrupt (the message names the file; deleting "
            "it starts over), or the free space cannot hold the download plus its reserve "
            "(`no-space`, naming the bytes needed; nothing downloaded)"
        ),
        "after fixing the disk",
    ),
    "ANALYZE_FAILED": (
        (
            "`edgereg analyze`: a critical guardrail failed (the candidate is worse than the "
            "stable by more than its limit); `edgereg rollout --auto`: a critical guardrail "
            "failed and the rollout was paused or rolled back"
        ),
        "no: see [canary analysis](../operations/canary-analysis.md)",
    ),
    "ANALYZE_INCONCLUSIVE": (
        (
            "`edgereg analyze`: inconclusive: not every guardrail passes yet (too few "
            "reports, an interval that holds the limit, or a non-critical guardrail failed); "
            "`edgereg rollout --auto` waits in this case and exits 0"
        ),
        "yes, later: more reports come in",
    ),
    "INTERNAL_ERROR": (
        "internal error: please report it, with the `--verbose` traceback",
        "",
    ),
    "INTERRUPTED": (
        "interrupted (Ctrl-C)",
        "",
    ),
}

EXIT_CODES_AFTER = (
    "`edgereg pull` exits 5 also when it refuses a manifest or a blob (the reason\n"
    "code is in the output, and with `--json` in `error_code`: also\n"
    "`app-incompatible`, `os-incompatible`, `bad-release`), or when an install\n"
    "check rejects the release; it keeps the model (or bundle) it had. A download\n"
    "deferred by `--no-allow-metered` / `--require-charging` is not a failure\n"
    "(exit 0, `deferred` in the output).\n"
    "\n"
    "DVC's own statuses, for scripts around `dvc repro`: 0 success (also when\n"
    "everything is up to date), 255 a stage failed (the `edgereg build` message\n"
    "above it says which and why), 253 not a DVC repository.\n"
)


def exit_codes_reference() -> str:
    """The exit-codes page: one row per :class:`edgereg.errors.ExitCode`, in its order."""
    from edgereg.errors import ExitCode

    names = {code.name for code in ExitCode}
    if names != set(EXIT_CODE_ROWS):
        missing = sorted(names - set(EXIT_CODE_ROWS))
        extra = sorted(set(EXIT_CODE_ROWS) - names)
        raise SystemExit(f"EXIT_CODE_ROWS: add {missing}, delete {extra}")
    rows = [[str(code.value), *EXIT_CODE_ROWS[code.name]] for code in ExitCode]
    lines = [
        "<!-- Generated by docs/gen/reference.py from edgereg.errors.ExitCode; do not edit. "
        "Run: python docs/gen/reference.py -->",
        "",
        "# Exit codes",
        "",
        "Every `edgereg` command ends with one of these statuses, and on an error with",
        "one paragraph on stderr saying what was found, what was expected and what to",
        "do next. `edgereg --verbose COMMAND` (or `edgereg COMMAND -v`) adds the",
        "traceback. `edgereg --help` prints the short form of this table; both come",
        "from `ExitCode` in `edgereg/protocol/errors.py` (re-exported by `edgereg.errors`).",
        "",
        "| code | meaning | retry? |",
        "|---|---|---|",
        *(f"| {code} | {meaning} | {retry}".rstrip() + " |" for code, meaning, retry in rows),
        "",
    ]
    return "\n".join(lines) + "\n" + EXIT_CODES_AFTER


# --- the task kinds' tables in docs/models-toml.md ----------------------------------

# A hand-written page with generated tables: each sits between these two lines.
_TABLE = re.compile(
    r"(<!-- generated by docs/gen/reference\.py from edgereg/tasks: (?P<name>[a-z-]+) -->\n)"
    r".*?(<!-- end of (?P=name) -->)",
    re.S,
)


def _task_settings(task: Any) -> str:
    """The settings column of a task kind: its keys, their defaults, what is required."""
    from edgereg.config import PinnedFile

    cells = ["`classes` (model key, optional)"] if task.NAMED_CLASSES else []
    for name, field in task.model_fields.items():
        if name in ("kind", "output"):
            continue
        if field.is_required():
            pinned = "pinned file, " if field.annotation is PinnedFile else ""
            cells.append(f"`{name}` ({pinned}required)")
        elif field.default is None:
            cells.append(f"`{name}`")
        else:
            cells.append(f"`{name}` = {_toml(field.default)}")
    return ", ".join(cells) or "—"


def task_tables() -> dict[str, list[str]]:
    """The task kinds' tables of docs/models-toml.md, by name, from edgereg.tasks."""
    from edgereg.build.quality import DEFAULT_AGREEMENT, default_budgets
    from edgereg.tasks import TASK_CLASSES

    kinds = _table(
        ["`task`", "settings", "for"],
        [
            [_code(_toml(kind)), _task_settings(task), task.PURPOSE]
            for kind, task in TASK_CLASSES.items()
        ],
    )
    metrics = _table(
        ["task", "metric", "against", "better", "measures"],
        [
            [
                kind,
                _code(metric.name),
                metric.against,
                "higher" if metric.higher_is_better else "lower",
                _escape(metric.description),
            ]
            for kind, task in TASK_CLASSES.items()
            for metric in task.METRICS
        ],
    )
    # A column per default minimum, the kinds in the registry's order.
    columns = [
        (kind, name)
        for kind, task in TASK_CLASSES.items()
        for name, limit in task.DEFAULT_LIMITS.get("int8", {}).items()
        if limit.min is not None
    ]
    defaults = _table(
        ["precision", "`min_cosine`", "`min_snr_db`"]
        + [f"{kind} `{name}.min`" for kind, name in columns],
        [
            [precision, f"{cosine:g}", f"{snr:g}"]
            + [
                f"{TASK_CLASSES[kind].DEFAULT_LIMITS[precision][name].min:g}"
                for kind, name in columns
            ]
            for precision, (cosine, snr) in DEFAULT_AGREEMENT.items()
        ],
    )
    label_rows = []
    for kind in TASK_CLASSES:
        budgets = default_budgets(kind, "fp32")
        limits = [
            f"`{name}.max_drop = {limit.max_drop:g}`"
            for name, limit in budgets.metrics.items()
            if limit.max_drop is not None
        ] + [
            f"`{name}.max = {limit.max:g}`"
            for name, limit in budgets.metrics.items()
            if limit.max is not None
        ]
        if limits:
            label_rows.append([kind, ", ".join(limits)])
    labels = _table(["task", "label metric default"], label_rows)
    datasets = _table(
        ["task", "`labels`", "example"],
        [[kind, *task.LABELS] for kind, task in TASK_CLASSES.items()],
    )
    return {
        "task-kinds": kinds,
        "task-metrics": metrics,
        "default-budgets": defaults,
        "label-defaults": labels,
        "task-labels": datasets,
    }


#: The hand-written pages that hold generated task tables, and which.
GUIDE_TABLES = {
    "models-toml.md": ("task-kinds", "task-metrics", "default-budgets", "label-defaults"),
    "build.md": ("task-labels",),
}


def _guide(page: str) -> str:
    """A guide page with its task tables as edgereg/tasks gives them."""
    text = (DOCS / page).read_text(encoding="utf-8")
    tables = {name: lines for name, lines in task_tables().items() if name in GUIDE_TABLES[page]}
    found = set()

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in tables:
            raise SystemExit(f"docs/{page}: no generated table called {name!r}")
        found.add(name)
        return match[1] + "\n".join(tables[name]) + "\n" + match[3]

    text = _TABLE.sub(fill, text)
    missing = sorted(set(tables) - found)
    if missing:
        raise SystemExit(f"docs/{page}: the generated tables {missing} have no place")
    return text


# --- entry point --------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reference/models-toml.md": models_toml_reference,
    "reference/cli.md": cli_reference,
    "reference/exit-codes.md": exit_codes_reference,
    **{page: functools.partial(_guide, page) for page in GUIDE_TABLES},
}


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The generated pages whose committed text differs from what the code gives."""
    stale = []
    for relative, render in PAGES.items():
        path = docs / relative
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != render():
            stale.append(relative)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated pages, or with --check report the stale ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for relative in stale:
            print(f"docs/{relative} is stale; run python docs/gen/reference.py", file=sys.stderr)
        return 1 if stale else 0
    for relative, render in PAGES.items():
        path = DOCS / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        text = render()
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/{relative}")
    return 0


if __name__ == "__main__":
    # Run as a script from any directory: make the repository importable.
    sys.path.insert(0, str(DOCS.parent))
    sys.exit(main())
