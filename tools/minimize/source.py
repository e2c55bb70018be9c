"""What the minimizer reads from a candidate's source without running it: its files, its size, the
statements marked ``# minimize: keep``, names bound nowhere, calls that cannot bind, and where
a traceback's exception was raised (the crash site)."""

from __future__ import annotations

import ast
import builtins
import functools
import io
import os
import re
import shutil
import subprocess
import tokenize

from tools.minimize.options import MARK
from tools.stages.project import project_files  # noqa: F401  (the minimizer's, too)


def size(files: dict[str, str | None]) -> tuple[int, int]:
    """Non-blank lines and tokens (no comments, newlines or indentation) of the files."""
    lines = tokens = 0
    for source in files.values():
        if not source:
            continue
        lines += sum(1 for line in source.splitlines() if line.strip())
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                tokenize.ENDMARKER}
        try:
            tokens += sum(1 for t in tokenize.generate_tokens(io.StringIO(source).readline)
                          if t.type not in skip)
        except (tokenize.TokenError, SyntaxError):
            pass
    return lines, tokens


# -- checks made without a launch ----------------------------------------------------------

def kept_statements(source: str) -> list[str]:
    """``ast.dump`` of every statement whose first line carries ``# minimize: keep``, and of every
    module-level function or class such a statement calls by name (and of what those call, in
    turn): a marked check stays whole, not only its marked lines. (A reduction once emptied the
    function a marked line called, and the marked ``raise`` then fired without the bug.)"""
    tree = ast.parse(source)
    marked = {i for i, line in enumerate(source.splitlines(), 1) if MARK.search(line)}
    kept = [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.lineno in marked]
    defs = {n.name: n for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    called: set[str] = set()
    todo = list(kept)
    while todo:
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in defs and node.func.id not in called:
                called.add(node.func.id)
                todo.append(defs[node.func.id])
    return [ast.dump(node) for node in kept] + [ast.dump(defs[n]) for n in sorted(called)
                                                 if defs[n] not in kept]


def missing_kept(files: dict[str, str | None], kept: dict[str, list[str]]) -> str | None:
    for name, dumps in kept.items():
        source = files.get(name)
        present = ({ast.dump(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)}
                   if source else set())
        for dump in dumps:
            if dump not in present:
                return f"a statement marked '# minimize: keep' in {name} is gone or changed"
    return None


MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                "__builtins__", "__annotations__", "__dict__", "__path__"}


def unbound_names(source: str) -> set[str]:
    """Names read somewhere in ``source`` but bound nowhere in it (by any import, definition,
    assignment, argument, loop, ``with``, ``except`` or pattern) and not builtins: certain
    NameErrors if that code runs. Empty with a star import (anything may be bound)."""
    tree = ast.parse(source)
    bound, read = set(MODULE_NAMES) | set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return set()
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.add(node.rest)
    return read - bound


def _binds(args: ast.arguments, call: ast.Call, skip_self: bool) -> bool:
    """Could ``call``'s arguments bind to the parameters ``args``? (A star in the call: yes.)"""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True
    positional = [*args.posonlyargs, *args.args][1 if skip_self else 0:]
    named = {a.arg for a in [*args.args, *args.kwonlyargs]}
    if len(call.args) > len(positional) and not args.vararg:
        return False
    given = {k.arg for k in call.keywords}
    if not args.kwarg and not given <= named:
        return False
    required = positional[:len(positional) - len(args.defaults)]
    if any(p.arg not in given for p in required[len(call.args):]):
        return False
    return all(d is not None or k.arg in given
               for k, d in zip(args.kwonlyargs, args.kw_defaults, strict=True))


def call_mismatches(source: str) -> set[str]:
    """Module-level functions and classes (with their own ``__init__``), each defined once, that
    are called by name with arguments their parameters cannot take: certain TypeErrors when that
    code runs."""
    tree = ast.parse(source)
    defs: dict[str, list] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defs.setdefault(node.name, []).append((node.args, False))
        elif isinstance(node, ast.ClassDef):
            init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
            defs.setdefault(node.name, []).append((init[0].args, True) if init and not node.keywords
                                                  else None)
    rebound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
               for t in ([n.target] if not isinstance(n, ast.Assign) else n.targets)
               if isinstance(t, ast.Name)}
    signatures = {name: d[0] for name, d in defs.items() if len(d) == 1 and d[0] and name not in rebound}
    return {node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in signatures and not _binds(signatures[node.func.id][0], node,
                                                              signatures[node.func.id][1])}


# values a removal may leave behind (a default, an empty call), by type: 1.0 == 1 == True in Python
SIMPLEST = {(type(None), None), (int, 0), (bool, True), (bool, False), (str, "")}


def constants(source: str) -> set:
    """The (type, value) of every literal, but the text pieces of f-strings (taking an expression
    out of one joins its neighbours: not a changed value)."""
    tree = ast.parse(source)
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return {(type(n.value), n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and id(n) not in pieces}


def static_rejection(files: dict[str, str | None], script: str, kept: dict[str, list[str]],
                     original: dict[str, tuple[set, set]]) -> str | None:
    """Why a candidate cannot be interesting, or is not worth a launch, without running it; or
    None. ``original``: per file, the names it already reads without binding them and the calls
    that already cannot bind (neither held against it), and its constants."""
    if not files.get(script):
        return "the script itself is gone"
    for name, source in files.items():
        if source is None:
            continue
        unbound, values, mismatched = original[name]
        names = unbound_names(source) - unbound
        if names:
            return f"{name} reads names bound nowhere: {', '.join(sorted(names)[:3])}"
        calls = call_mismatches(source) - mismatched
        if calls:
            return f"{name}: a call with arguments its function cannot take ({sorted(calls)[0]}())"
        if "unique_name_" in source:
            return "a renamed variable (names are kept as the user wrote them)"
        new = constants(source) - values - SIMPLEST
        if new:
            return f"a changed value ({sorted(map(repr, (v[1] for v in new)))[0][:40]}): values are kept"
    return missing_kept(files, kept)


BLOCKS = ("body", "orelse", "finalbody")


def headers(source: str) -> set[str]:
    """``ast.dump`` of every statement with its nested statement lists emptied (its "header")."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt):
            fields = {f: [] for f in BLOCKS if isinstance(getattr(node, f, None), list)}
            # except and case clauses: their own header only (their bodies hold statements)
            if isinstance(node, ast.Try | ast.TryStar):
                fields["handlers"] = [ast.ExceptHandler(h.type, h.name, []) for h in node.handlers]
            if isinstance(node, ast.Match):
                fields["cases"] = [ast.match_case(c.pattern, c.guard, []) for c in node.cases]
            found.add(ast.dump(type(node)(**{**dict(ast.iter_fields(node)), **fields})))
    return found


def only_removes_statements(files: dict[str, str | None], current: dict[str, str | None]) -> bool:
    """Is every statement of the candidate, header for header, one of the current best's (plus
    the ``pass`` a reducer leaves in an emptied block)? Then it removed or moved whole statements,
    and changed nothing inside one."""
    allowed = {ast.dump(ast.Pass())}
    for name, source in files.items():
        if source is None or source == current.get(name):
            continue
        if not headers(source) <= headers(current.get(name) or "") | allowed:
            return False
    return True


def _literal_texts(node: ast.AST, consts: dict[str, str]) -> list[str]:
    """What ``node`` prints if it is text built from literals: a str or bytes constant, an
    f-string, a ``+`` of literals, ``"..." % x`` or ``"...".format(x)``, where a name bound to a
    string constant (``consts``) counts as that string and any other part as empty."""
    def text(n) -> str | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes):
            return n.value.decode(errors="replace") if isinstance(n.value, bytes) else n.value
        if isinstance(n, ast.Name):
            return consts.get(n.id)
        if isinstance(n, ast.FormattedValue):
            return text(n.value)
        return None

    def parts(n) -> list[str | None] | None:  # None: not built from literals at all
        if isinstance(n, ast.Constant) and isinstance(n.value, str | bytes):
            return [text(n)]
        if isinstance(n, ast.JoinedStr):
            return [text(v) for v in n.values]
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            left, right = parts(n.left), parts(n.right)
            if left is None and right is None:
                return None
            return [*(left or [text(n.left)]), *(right or [text(n.right)])]
        return None

    template = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):  # "... %s" % value
        template = node.left.value
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        fields = r"%[-#0 +]*\d*(?:\.\d+)?[a-zA-Z]"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
        template, args, fields = node.func.value.value, node.args, r"\{[^{}]*\}"
    if template is not None:
        values = iter([text(a) or "" for a in args])
        return [re.sub(fields, lambda _: next(values, ""), template)]
    found = parts(node)
    return ["".join(p or "" for p in found)] if found else []


def prints_signature_itself(files: dict[str, str], signature: str | None) -> str | None:
    """Where the project could print the signature itself: a literal that matches it, whatever
    its kind (str, bytes, an f-string, a concatenation; docstrings aside)."""
    if not signature:
        return None
    for name, source in files.items():
        tree = ast.parse(source)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}
        consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue
            if any(re.search(signature, text) for text in _literal_texts(node, consts)):
                return f"{name}, line {node.lineno}"
    return None


def outside_source_lines(text: str) -> str:
    """``text`` without the source lines tracebacks quote (the indented line after each
    ``File "...", line N, in f``): a program that fails on a line holding the signature's text
    has not printed the signature."""
    out, quoting = [], False
    for line in text.splitlines():
        if quoting and RANK.sub("", line).startswith((" ", "\t")) and not FRAME.match(line):
            quoting = False
            continue
        quoting = bool(FRAME.match(line))
        out.append(line)
    return "\n".join(out)


# -- where the signature was raised --------------------------------------------------------

FRAME = re.compile(r'^\s*(?:\[rank\d+\]:\s*)?File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')
EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<type>[A-Za-z_][\w.]*)(?::\s|:$|$)")
RANK = re.compile(r"^\[rank\d+\]:")


def crash_site(text: str, signature: str | None, roots: tuple[str, ...]) -> tuple[str, ...] | None:
    """(exception type, file, function of the innermost frame) of the first traceback whose
    exception line matches ``signature``; None when the signature is not an exception's.
    Files inside ``roots`` (the project, a candidate's folder) are named relative to it; others
    from ``site-packages/`` on."""
    if not signature:
        return None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        exc = EXCEPTION.match(line)
        if not (exc and re.search(signature, line)):
            continue
        for back in range(i - 1, -1, -1):  # up through this traceback's own (indented) lines only
            frame = FRAME.match(lines[back])
            if frame:
                return exc["type"], _where(frame["path"], roots), frame["func"]
            if not RANK.sub("", lines[back]).startswith((" ", "\t")):
                break  # not an exception's line after all: a later one may be
    return None


def _where(path: str, roots: tuple[str, ...]) -> str:
    for root in roots:
        if path.startswith(root.rstrip("/") + "/"):
            return os.path.relpath(path, root)
    cut = path.rfind("site-packages/")
    return path[cut + len("site-packages/"):] if cut >= 0 else path


@functools.lru_cache(maxsize=4096)
def formatted(source: str) -> str:
    """``ruff format`` of ``source`` when ruff is installed; ``source`` as it is otherwise."""
    ruff = shutil.which("ruff")
    if not ruff:
        return source
    proc = subprocess.run([ruff, "format", "--quiet", "--line-length", "100", "-"], input=source,
                          capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 and proc.stdout else source


def shown_size(files: dict[str, str | None]) -> tuple[int, int]:
    """``size`` of the files as ``minimized.py`` shows them (formatted): an inlined call that
    makes one line too long for the formatter is three lines there, not one fewer."""
    return size({n: formatted(s) if s else s for n, s in files.items()})
