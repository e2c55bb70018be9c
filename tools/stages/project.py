"""A user's project as the workspace reads it: the script, and the ``.py`` files of its folder
that it imports, directly or through each other (the bisect's cache key, the minimizer's input)."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.core.contract import BadInput


def project_files(script: Path) -> dict[str, str]:
    """The script and, transitively, the ``.py`` files of its folder that it imports, by name
    relative to that folder (the script first)."""
    folder, found, todo = script.parent, {}, [script.name]
    while todo:
        name = todo.pop(0)
        if name in found:
            continue
        try:
            source = (folder / name).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise BadInput(f"{name}: cannot read it ({err})") from None
        try:
            tree = ast.parse(source, filename=name)
        except SyntaxError as err:
            raise BadInput(f"{name}: not valid Python ({err.msg}, line {err.lineno})") from None
        found[name] = source
        for node in ast.walk(tree):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                       else [])
            for module in modules:
                candidate = module.split(".")[0] + ".py"
                if (folder / candidate).is_file():
                    todo.append(candidate)
    return found
