#!/usr/bin/env python3
"""Write android-24.txt: what Android 7.0 (API level 24) provides of java.* and javax.*.

The table is made from AOSP's frozen public API of that level.

Usage: python3 generate.py ANDROID_TXT [--source TEXT] [--out android-24.txt]

ANDROID_TXT is AOSP platform/prebuilts/sdk's 24/public/api/android.txt (signature format 2.0:
every public and protected class, constructor, method and field of API level 24, as Java
source text). This script keeps the java.* and javax.* packages and writes each class as its
JVM name, super class and interfaces, and each member as its JVM name and erased descriptor,
which is what a class file's constant pool names. The signature file leaves out a method that
overrides an inherited one unchanged; the table keeps the extends/implements lines so a check
resolves a member through the supertypes, as the JVM does. Enums' implicit values() and
valueOf(String) (JLS 8.9.3) are added. Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import re
import sys
from pathlib import Path

FORMAT_LINE = "// Signature format: 2.0"
KEEP = re.compile(r"^javax?\.")
MODIFIERS = {
    "public",
    "protected",
    "private",
    "static",
    "final",
    "abstract",
    "default",
    "synchronized",
    "native",
    "transient",
    "volatile",
    "strictfp",
    "sealed",
}
PRIMITIVES = {
    "boolean": "Z",
    "byte": "B",
    "char": "C",
    "short": "S",
    "int": "I",
    "long": "J",
    "float": "F",
    "double": "D",
    "void": "V",
}
CLASS_KINDS = ("class", "interface", "enum", "@interface")
ANNOTATION = re.compile(r"@(?!interface\b)[\w.]+(\([^)]*\))?\s*")


class GenerateError(Exception):
    """The signature file is not what this script reads."""


def split_top(text: str, sep: str) -> list[str]:
    """Split at sep outside <...>; empty pieces dropped."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        if depth == 0 and ch == sep:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def strip_args(t: str) -> str:
    """Drop type arguments: java.util.Map.Entry<K,V>[] -> java.util.Map.Entry[]."""
    out, depth = [], 0
    for ch in t:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip()


def parse_type_params(text: str) -> dict[str, str]:
    """'<T, U extends java.lang.Comparable<? super U> & X>' -> {name: first bound or Object}."""
    inner = text.strip()[1:-1]
    result = {}
    for piece in split_top(inner, ","):
        words = piece.split(None, 2)
        bound = "Object"
        if len(words) == 3 and words[1] == "extends":
            bound = split_top(words[2], "&")[0]
        result[words[0]] = bound
    return result


class Api:
    """The packages and classes read so far."""

    def __init__(self) -> None:
        self.packages: set[str] = set()
        # JVM class name -> (kind, super or "", interfaces, members, type params, source name)
        self.classes: dict[str, dict] = {}

    def jvm_class(self, dotted: str) -> str:
        """java.util.Map.Entry -> java/util/Map$Entry; Object -> java/lang/Object."""
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            pkg = ".".join(parts[:cut])
            if pkg in self.packages:
                return pkg.replace(".", "/") + "/" + "$".join(parts[cut:])
        return "java/lang/" + "$".join(parts)  # format 2.0 writes java.lang types bare


def erase(api: Api, t: str, tvars: dict[str, str], seen: frozenset = frozenset()) -> str:
    """The JVM descriptor of a source type (JLS 4.6 erasure; type variables to their bound)."""
    t = strip_args(t)
    dims = 0
    if t.endswith("..."):
        dims, t = 1, t[:-3]
    while t.endswith("[]"):
        dims, t = dims + 1, t[:-2].strip()
    t = t.strip()
    if t in PRIMITIVES:
        base = PRIMITIVES[t]
    elif t in tvars and t not in seen:
        base = erase(api, tvars[t], tvars, seen | {t})
    elif t in ("?",) or t.startswith("? "):
        base = "Ljava/lang/Object;"
    else:
        base = "L" + api.jvm_class(t) + ";"
    return "[" * dims + base


def header_words(line: str) -> list[str]:
    """A class header's words, annotations dropped."""
    return split_top(ANNOTATION.sub("", line.strip().rstrip("{").strip()), " ")


def parse(text: str) -> Api:
    """Read the java.* and javax.* classes and members of a signature file."""
    if not text.startswith(FORMAT_LINE):
        first = text.splitlines()[0] if text else ""
        raise GenerateError(f"not a signature file of format 2.0 (first line {first!r})")
    lines = text.splitlines()
    api = Api()
    for line in lines:
        m = re.match(r"^package ([\w.]+) \{$", line)
        if m:
            api.packages.add(m.group(1))
    package = None
    cls = None
    pending: list[tuple[dict, str]] = []
    for number, line in enumerate(lines, 1):
        m = re.match(r"^package ([\w.]+) \{$", line)
        if m:
            package = m.group(1) if KEEP.match(m.group(1)) else None
            continue
        if package is None or not line.strip() or line.strip() == "}":
            continue
        if line.startswith("  ") and not line.startswith("    "):
            words = header_words(line)
            kinds = [i for i, w in enumerate(words) if w in CLASS_KINDS]
            if not kinds:
                raise GenerateError(f"line {number}: a class header without a kind: {line.strip()}")
            k = kinds[0]
            kind, name_tp = words[k], words[k + 1]
            simple = strip_args(name_tp)
            tparams = parse_type_params(name_tp[len(simple) :]) if "<" in name_tp else {}
            rest = words[k + 2 :]
            supers: list[str] = []
            ifaces: list[str] = []
            target = None
            for w in rest:
                if w == "extends":
                    target = "extends"
                elif w == "implements":
                    target = "implements"
                elif target == "extends" and kind == "interface":
                    ifaces.append(w)
                elif target == "extends":
                    supers.append(w)
                elif target == "implements":
                    ifaces.append(w)
            jvm = package.replace(".", "/") + "/" + simple.replace(".", "$")
            if kind == "enum" and not supers:
                supers = ["java.lang.Enum"]
            if kind == "@interface":
                ifaces = ["java.lang.annotation.Annotation", *ifaces]
            if kind == "class" and not supers and jvm != "java/lang/Object":
                supers = ["java.lang.Object"]
            cls = {
                "kind": "interface" if kind in ("interface", "@interface") else "class",
                "super": supers,
                "ifaces": ifaces,
                "members": set(),
                "tparams": tparams,
                "simple": simple,
                "enum": kind == "enum",
            }
            api.classes[jvm] = cls
            pending.append((cls, jvm))
            continue
        if cls is None:
            raise GenerateError(f"line {number}: a member outside a class")
        cls.setdefault("lines", []).append((number, line.strip()))
    # Members after every class is known (a nested class's type parameters include its outer's).
    for cls, jvm in pending:
        outer_tp: dict[str, str] = {}
        parts = jvm.split("$")
        for i in range(1, len(parts)):
            outer = api.classes.get("$".join(parts[:i]))
            if outer:
                outer_tp.update(outer["tparams"])
        tvars = {**outer_tp, **cls["tparams"]}
        cls["super"] = [api.jvm_class(strip_args(s)) for s in cls["super"]]
        cls["ifaces"] = [api.jvm_class(strip_args(s)) for s in cls["ifaces"]]
        for number, line in cls.pop("lines", []):
            try:
                cls["members"].add(member(api, line, tvars, cls))
            except (GenerateError, IndexError, KeyError) as e:
                raise GenerateError(f"line {number}: cannot read {line!r}: {e}") from None
        if cls["enum"]:
            cls["members"].add(f"values()[L{jvm};")
            cls["members"].add(f"valueOf(Ljava/lang/String;)L{jvm};")
    return api


def member(api: Api, line: str, tvars: dict[str, str], cls: dict) -> str:
    """One member line as name(params)return or name:type."""
    kind, _, body = line.partition(" ")
    body = ANNOTATION.sub("", body).rstrip(";").strip()
    if kind in ("field", "enum_constant"):
        body = body.split(" = ", 1)[0]
        words = [w for w in split_top(body, " ") if w not in MODIFIERS]
        return f"{words[-1]}:{erase(api, words[-2], tvars)}"
    if kind not in ("ctor", "method"):
        raise GenerateError(f"unknown member kind {kind!r}")
    head, _, tail = body.partition("(")
    params_text = tail.rsplit(")", 1)[0]
    words = [w for w in split_top(head, " ") if w not in MODIFIERS]
    mtvars = dict(tvars)
    if words and words[0].startswith("<"):
        mtvars.update(parse_type_params(words[0]))
        words = words[1:]
    params = "".join(erase(api, p, mtvars) for p in split_top(params_text, ","))
    if kind == "ctor":
        return f"<init>({params})V"
    if len(words) != 2:
        raise GenerateError(f"expected a return type and a name, got {words}")
    return f"{words[1]}({params}){erase(api, words[0], mtvars)}"


def check_closed(api: Api) -> list[str]:
    """Classes of java/javax the table names (supertypes, member types) but lacks."""
    missing = set()
    names = set(api.classes)
    for jvm, cls in api.classes.items():
        refs = list(cls["super"]) + list(cls["ifaces"])
        for m in cls["members"]:
            refs += re.findall(r"L([^;]+);", m)
        for r in refs:
            if re.match(r"^javax?/", r) and r not in names:
                missing.add(f"{r} (named by {jvm})")
    return sorted(missing)


def write(api: Api, out: Path, source: str, digest: str, blob: str) -> None:
    """Write the table with its provenance at the top."""
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [
        "# What Android 7.0 (API level 24) provides of java.* and javax.*: every public and",
        "# protected class, constructor, method and field, as JVM names and erased descriptors.",
        "# The library jar may reference only what is here (make api-check: src/tools ApiCheck);",
        "# anything else fails the build.",
        "#",
        "# Source: AOSP platform/prebuilts/sdk, file 24/public/api/android.txt: the frozen public",
        "#   API of API level 24 that the Android build checks every later level against",
        "#   (signature format 2.0).",
        f"#   git blob {blob}, sha256 {digest}",
        f"#   {source}",
        f"# Generated {today} by clients/android/api/generate.py from that file; never edited.",
        "#",
        "# 'class'/'interface' NAME [extends SUPER] [implements I...]; its members below it,",
        "# indented: name(params)return for constructors (<init>) and methods, name:type for",
        "# fields. A member a class inherits unchanged is listed only where it is declared",
        "# (resolve through the supertypes). Enums' implicit values() and valueOf(String) are",
        "# listed (JLS 8.9.3).",
    ]
    for jvm in sorted(api.classes):
        cls = api.classes[jvm]
        head = f"{cls['kind']} {jvm}"
        if cls["super"]:
            head += " extends " + cls["super"][0]
        if cls["ifaces"]:
            head += " implements " + " ".join(cls["ifaces"])
        lines.append(head)
        lines.extend("  " + m for m in sorted(cls["members"]))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    """Generate the table; 0 when written, 1 when the source is unreadable as an API."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("android_txt", type=Path)
    ap.add_argument(
        "--source",
        default="read from a mirror of platform/prebuilts/sdk",
        help="where the file was read (written into the table's header)",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("android-24.txt"))
    args = ap.parse_args(argv)
    try:
        data = args.android_txt.read_bytes()
    except OSError as e:
        print(f"generate.py: cannot read {args.android_txt}: {e.strerror}", file=sys.stderr)
        return 2
    digest = hashlib.sha256(data).hexdigest()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    try:
        api = parse(data.decode("utf-8"))
    except (GenerateError, UnicodeDecodeError) as e:
        print(f"generate.py: {args.android_txt}: {e}", file=sys.stderr)
        return 1
    missing = check_closed(api)
    if missing:
        print("generate.py: the table names classes it lacks (misread):", file=sys.stderr)
        print("\n".join("  " + m for m in missing[:40]), file=sys.stderr)
        return 1
    tmp = args.out.with_suffix(".tmp")
    write(api, tmp, args.source, digest, blob)
    tmp.replace(args.out)
    count = sum(len(c["members"]) for c in api.classes.values())
    print(f"{args.out}: {len(api.classes)} classes, {count} members (source sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
