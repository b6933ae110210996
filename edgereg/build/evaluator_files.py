"""The repository files a custom evaluator's verdict depends on: its module and what it imports.

A custom task names ``module:function``, imported with the directory of
models.toml first on ``sys.path`` (:func:`edgereg.tasks.custom_eval.load_evaluator`).
Its gates live in that code, so the module, and every module of the repository
it imports (at any depth, packages' ``__init__.py`` included), is a DVC
dependency of the stages that use it: tightening a gate reruns the evaluation.

Found by reading the source (``ast``), never by importing it: ``edgereg dvc
sync`` must not run the team's code. Imports of modules outside the repository
(numpy, an installed package) are not followed; an import inside a function
body or under ``if`` counts like one at the top, since either may run.
"""

from __future__ import annotations

import ast
from pathlib import Path


def evaluator_files(root: Path, spec: str) -> list[str]:
    """The files of ``spec``'s module and its in-repository imports, relative to ``root``.

    Args:
        root: The directory of models.toml (first on ``sys.path`` at build time).
        spec: ``module:function``.

    Returns:
        POSIX paths relative to ``root``, in a stable order (the module first);
        empty when the module is not a file under ``root`` (an installed
        package: the build's import error names it if it is missing).
    """
    base = root.resolve()
    module = spec.partition(":")[0]
    found: dict[str, None] = {}
    pending = [module]
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for path in _module_files(base, name):
            relative = path.relative_to(base).as_posix()
            if relative in found:
                continue
            found[relative] = None
            pending += _imports(path, name, is_package=path.name == "__init__.py")
    return list(found)


def _module_files(base: Path, name: str) -> list[Path]:
    """The files importing ``name`` runs from ``base``: parent packages' ``__init__``, then it.

    Empty when the module itself is not under ``base``.
    """
    parts = name.split(".")
    target = base.joinpath(*parts)
    module = target.with_suffix(".py")
    if module.is_file():
        own = module
    elif (target / "__init__.py").is_file():
        own = target / "__init__.py"
    else:
        return []
    parents = [
        base.joinpath(*parts[:depth], "__init__.py")
        for depth in range(1, len(parts))
        if base.joinpath(*parts[:depth], "__init__.py").is_file()
    ]
    return [own, *parents]


def _imports(path: Path, name: str, *, is_package: bool) -> list[str]:
    """Module names ``path`` (module ``name``) imports, relative imports resolved."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # the build's import names the problem
    package = name if is_package else name.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".") if package else []
                if node.level - 1 >= len(anchor) and node.level > 1:
                    continue  # beyond the top-level package: Python refuses it too
                prefix = ".".join(anchor[: len(anchor) - (node.level - 1)])
                stem = ".".join(p for p in (prefix, node.module or "") if p)
            else:
                stem = node.module or ""
            if stem:
                names.append(stem)
            # `from pkg import mod` imports pkg.mod when it is a module.
            names += [f"{stem}.{alias.name}" if stem else alias.name for alias in node.names]
    return names
