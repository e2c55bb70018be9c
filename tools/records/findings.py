"""``nox -s findings``: FINDINGS.md, generated from the recorded runs in ``findings/``.

A run's result files (``results/<kind>/<time>/``, gitignored) become committed data with
``nox -s findings -- --record KIND[=RUN_DIR]``: only its small JSON / Markdown summaries are
copied, machine paths and package-index hosts replaced by placeholders, into
``findings/<kind>/<name>/`` with a ``record.json`` (where the run came from, when, the command,
the versions), replacing the previous record of that kind and name (a patches run of some patches,
``--patch``, replaces only their rows of the series' record, and the record says which run each row
came from). ``nox -s findings`` renders
FINDINGS.md from ``findings/`` alone: the same data gives the same bytes, and re-recording a run
updates its table. The PR bodies and the issue comments of ``nox -s pr`` quote the same tables.

Kinds (and the files copied): ``repro`` (a ``nox -s repro`` run: ``summary.json``), ``stress``
(a ``repro/ddp_weakref_stress.py --out`` folder, e.g. a cell's ``logs/<cell>/20706-stress``:
``summary.md``), ``bisect`` (``report.json``, ``report.md``; one record per bug and axis),
``patches`` (``summary.json``, ``summary.md``). Bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.core import contract, results

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "findings"
OUTPUT = ROOT / "FINDINGS.md"
KINDS = ("repro", "stress", "bisect", "patches", "triage")
FILES = {"repro": ("summary.json",), "stress": ("summary.md",),
         "bisect": ("report.json", "report.md"), "patches": ("summary.json", "summary.md"),
         "triage": ("summary.json", "summary.md")}
TITLES = {"repro": "Repro matrix (`nox -s repro`)",
          "stress": "#20706 stress scenarios (`repro/ddp_weakref_stress.py`)",
          "bisect": "Bisects (`nox -s bisect`)",
          "patches": "Patch validation (`nox -s patches`)",
          "triage": "The triage on the corpus of report shapes (`bench/triage_corpus.py`)"}
HOW = {"repro": "nox -s repro", "bisect": "nox -s bisect -- ...", "patches": "nox -s patches",
       "stress": "python repro/ddp_weakref_stress.py --out DIR",
       "triage": "python bench/triage_corpus.py --python .nox/tests/bin/python --out DIR"}
STRESS_SCRIPT = "repro/ddp_weakref_stress.py"
BISECT_REPRO = "repro/backbone_finetuning_ddp.py"  # the script of a bisect recorded when it was the default
STAMP = re.compile(r"^(\d{4})(\d\d)(\d\d)-(\d\d)(\d\d)(\d\d)$")  # results.run_dir's folder names
NAME = re.compile(r"^[A-Za-z0-9][\w.+-]*$")
# an absolute path of two parts or more, not inside a URL or a relative path
ABSOLUTE = re.compile(r"(?<![\w.:/~-])/[\w.+@-]+(?:/[\w.+@-]+)+/?")
URL = re.compile(r"https?://([^/\s\"'<>)`]+)[^\s\"'<>)`]*")
KEEP_HOSTS = {"github.com"}


class BadInput(contract.BadInput):
    """A run folder or a record that cannot be used (one line, exit 2)."""


def sanitize(text: str) -> str:
    """``text`` without machine paths or package-index hosts: a path inside this checkout
    becomes relative to it, any other absolute path ``<path>``, a URL not on GitHub ``<url>``."""
    text = text.replace(f"{ROOT}/", "")
    text = URL.sub(lambda m: m.group(0) if m.group(1) in KEEP_HOSTS else "<url>", text)
    return ABSOLUTE.sub("<path>", text)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: missing") from None
    except OSError as err:
        raise BadInput(f"{path}: cannot read it ({err.strerror})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8") from None


def _json(path: Path, text: str, kind: type):
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadInput(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, kind):
        raise BadInput(f"{path}: not a {kind.__name__} of results")
    return data


def _check_cells(path: Path, cells: list) -> None:
    """A ``summary.json`` of ``nox -s repro``: one object per cell."""
    for i, c in enumerate(cells, 1):
        cell = c.get("cell") if isinstance(c, dict) else None
        ok = isinstance(cell, dict) and all(isinstance(cell.get(k), str)
                                            for k in ("id", "package", "lightning", "torch"))
        if not ok or not (isinstance(c.get("results"), dict) or c.get("skipped")):
            raise BadInput(f"{path}: not a summary of `nox -s repro` (cell {i}: no cell id, "
                           f"versions and results)")


def check(kind: str, folder: Path, files: dict[str, str]) -> None:
    """The files of a run or a record are what their kind needs, or a BadInput."""
    if kind == "repro":
        _check_cells(folder / "summary.json", _json(folder / "summary.json", files["summary.json"], list))
    elif kind == "bisect":
        report = _json(folder / "report.json", files["report.json"], dict)
        if not isinstance(report.get("status"), str) or not isinstance(report.get("argv"), list):
            raise BadInput(f"{folder / 'report.json'}: not a report of `nox -s bisect` (no status, argv)")
    elif kind == "patches":
        results.read_patch_summary(folder / "summary.json")  # its BadInput is the contract's
    if kind == "stress" and not files["summary.md"].startswith("| scenario |"):
        raise BadInput(f"{folder / 'summary.md'}: not a summary of the stress catalogue")
    if kind == "triage" and not files["summary.md"].startswith("| report |"):
        raise BadInput(f"{folder / 'summary.md'}: not a summary of bench/triage_corpus.py")


# -- recording a run --------------------------------------------------------------------------

def _stamp(folder: Path, fallback: Path) -> str:
    """When the run was made: the newest ``YYYYMMDD-HHMMSS`` folder of its path, else the file's
    modification time."""
    for part in reversed(folder.parts):
        m = STAMP.match(part)
        if m:
            return "{}-{}-{} {}:{}:{}".format(*m.groups())
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fallback.stat().st_mtime))


def _source(folder: Path) -> str:
    try:
        return str(folder.relative_to(ROOT))
    except ValueError:
        return f"<path>/{folder.name}"


def _repro_meta(folder: Path, files: dict[str, str]) -> dict:
    cells = json.loads(files["summary.json"])
    ran = [c for c in cells if not c.get("skipped")]
    args = next((c.get("repro_args") or [] for c in ran), [])
    if any(c.get("launch") == "fresh-process" for c in ran):
        args = [*args, "--fresh-process"]
    pythons = sorted({r.get("record", {}).get("versions", {}).get("python") or "?"
                      for c in ran for r in c["results"].values() if isinstance(r.get("record"), dict)})
    return {"name": "matrix", "command": "nox -s repro" + (" -- " + shlex.join(args) if args else ""),
            "versions": f"Python {', '.join(pythons) or '?'}; Lightning and torch per row "
                        f"({len(ran)} cells ran, {len(cells) - len(ran)} not run)"}


def _stress_meta(folder: Path, files: dict[str, str]) -> dict:
    """A stress folder inside a ``nox -s repro`` run (``<run>/logs/<cell>/<repro>``) takes its
    versions from that cell's result; a folder of its own has none recorded."""
    if folder.parent.parent.name != "logs":
        return {"name": "stress", "command": HOW["stress"], "versions": "not recorded in the run folder"}
    cell_id, run = folder.parent.name, folder.parent.parent.parent
    meta = {"name": cell_id, "command": "nox -s repro", "part": f"cell {cell_id}, repro {folder.name}",
            "versions": "not recorded in the run folder"}
    cell_file = run / "cells" / f"{cell_id}.json"
    if cell_file.exists():
        cell = _json(cell_file, _read(cell_file), dict)
        record = ((cell.get("results") or {}).get(folder.name) or {}).get("record") or {}
        v = record.get("versions") or {}
        if v:
            meta["versions"] = (f"{cell.get('cell', {}).get('package', 'Lightning')} {v.get('lightning')}, "
                                f"torch {v.get('torch')}, Python {v.get('python')}")
    return meta


def bisect_args(argv: list[str]) -> argparse.Namespace:
    """The options of a recorded bisect that say what it was about."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--script", "--repro", dest="repro", default=BISECT_REPRO)  # --repro: its old name
    p.add_argument("--axis", default="lightning")
    p.add_argument("--tier", default="both")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, _ = p.parse_known_args(argv[:cut])
    args.repro_args = argv[cut + 1:]
    return args


def _bisect_meta(folder: Path, files: dict[str, str]) -> dict:
    report = json.loads(files["report.json"])
    argv = [str(a) for a in report["argv"]]
    args = bisect_args(argv)
    versions = re.search(r"(?m)^(Python [^;\n]*);", files["report.md"])
    return {"name": f"{Path(args.repro).stem}-{args.axis}", "command": "nox -s bisect -- " + shlex.join(argv),
            "versions": versions.group(1) if versions else "not stated in the report",
            "repro": args.repro, "repro_args": args.repro_args, "axis": args.axis,
            "status": report["status"]}


def _patches_meta(folder: Path, files: dict[str, str]) -> dict:
    rows = json.loads(files["summary.json"])
    rows = rows if isinstance(rows, list) else rows.get("rows", [])
    args = []
    for option, key in (("--patch", "patch"), ("--cell", "cell")):
        values = {r.get(key) for r in rows if isinstance(r, dict)}
        if len(values) == 1 and None not in values:
            args += [option, values.pop()]
    return {"name": "series", "command": "nox -s patches" + (" -- " + shlex.join(args) if args else ""),
            "versions": "per row: the matrix cell (Lightning x torch releases) it ran in"}


def _triage_meta(folder: Path, files: dict[str, str]) -> dict:
    return {"name": "corpus", "command": HOW["triage"],
            "versions": "per report: the releases its triage chose (the reporter's, the newest)"}


META = {"repro": _repro_meta, "stress": _stress_meta, "bisect": _bisect_meta, "patches": _patches_meta,
        "triage": _triage_meta}


def parse_record(spec: str) -> tuple[str, Path]:
    """``KIND[=RUN_DIR]`` (default run folder: ``results/<kind>/latest``)."""
    kind, _, where = spec.partition("=")
    if kind not in KINDS:
        raise BadInput(f"--record {spec}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
    return kind, Path(where) if where else results.latest_dir(kind)


def merge_patch_rows(final: Path, files: dict[str, str], meta: dict) -> tuple[dict[str, str], dict]:
    """A patches run of some patches (``--patch``) recorded over a record of more: the rows of the
    patches it ran replace theirs, in place, and the other rows are kept, with where they came from;
    the rows of a patch that left ``patches/series`` are dropped."""
    from tools.series import patches, series_gates

    new = json.loads(files["summary.json"])
    ran = {r.get("patch") for r in new}
    in_series = {p.name for p in patches.series()} | ran
    old = json.loads((final / "summary.json").read_text())
    gone = sorted({r.get("patch") for r in old if r.get("patch") not in in_series})
    if gone:
        print(f"{final}: dropped the rows of {', '.join(gone)} (no longer in the series)", flush=True)
    old = [r for r in old if r.get("patch") in in_series]
    kept = [r for r in old if r.get("patch") not in ran]
    if not kept:
        return files, meta

    rows, placed = [], False
    for r in old:
        if r.get("patch") in ran:
            if not placed:
                rows += new
                placed = True
        else:
            rows.append(r)
    if not placed:
        rows += new
    previous = json.loads((final / "record.json").read_text()) if (final / "record.json").is_file() else {}
    earlier = previous.get("rows_from") or [
        {"rows": sorted({r.get("patch") for r in old}), "source": previous.get("source", "?"),
         "date": previous.get("date", "?"), "command": previous.get("command", "?")}]
    earlier = [{**e, "rows": [p for p in e["rows"] if p not in ran and p in in_series]} for e in earlier]
    rows_from = [e for e in earlier if e["rows"]] + [
        {"rows": sorted(ran), "source": meta["source"], "date": meta["date"], "command": meta["command"]}]
    print(f"{final}: replaced the rows of {', '.join(sorted(ran))}, kept {len(kept)} other rows", flush=True)
    files = {**files, "summary.json": json.dumps(rows, indent=2, default=str) + "\n",
             "summary.md": series_gates.summary(rows).rstrip("\n") + "\n"}
    return files, {**meta, "command": "nox -s patches (rows of several runs: rows_from)",
                   "rows_from": rows_from}


def record(kind: str, run_dir: Path, name: str | None = None, data: Path | None = None) -> Path:
    """Copy a run's summaries into ``data/<kind>/<name>/``, replacing the previous record: the new
    record is made in full beside the old one and renamed into place."""
    data = Path(data or DATA)
    if not Path(run_dir).is_dir():
        raise BadInput(f"{run_dir}: no such run folder (run `{HOW[kind]}` first, or name one: "
                       f"--record {kind}=RUN_DIR)")
    folder = Path(run_dir).resolve()
    raw = {f: _read(folder / f) for f in FILES[kind]}
    check(kind, folder, raw)
    files = {f: sanitize(text) for f, text in raw.items()}
    meta = META[kind](folder, files)
    name = name or meta.pop("name")
    meta.pop("name", None)
    if not NAME.match(name):
        raise BadInput(f"--name {name!r}: letters, digits, '.', '_', '+' and '-' only")
    meta = {"kind": kind, "name": name, "source": _source(folder),
            "date": _stamp(folder, folder / FILES[kind][0]), **meta}
    final = data / kind / name
    if kind == "patches" and (final / "summary.json").is_file():
        files, meta = merge_patch_rows(final, files, meta)
    files["record.json"] = sanitize(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    check(kind, folder, files)  # still what its kind needs once sanitised
    final.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{name}.new-"))
    try:
        for f, text in files.items():
            results.write_atomic(new / f, text)
        new.chmod(0o755)
        old = final.parent / f".{name}.old-{new.name.rsplit('-', 1)[1]}"
        if final.exists():
            final.rename(old)
        try:
            new.rename(final)
        except OSError:
            if old.exists():
                old.rename(final)  # put the previous record back
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return final


# -- reading the records ----------------------------------------------------------------------

@dataclass
class Record:
    kind: str
    name: str
    meta: dict
    files: dict[str, str]

    def json(self, name: str):
        return json.loads(self.files[name])


def load(data: Path | None = None) -> dict[str, list[Record]]:
    """Every record of ``data``, by kind and sorted by name (dot-folders are records on their way
    in or out, and are left alone)."""
    data = Path(data or DATA)
    out: dict[str, list[Record]] = {kind: [] for kind in KINDS}
    for kind in KINDS:
        for folder in sorted((data / kind).glob("*")) if (data / kind).is_dir() else []:
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            files = {f: _read(folder / f) for f in (*FILES[kind], "record.json")}
            meta = _json(folder / "record.json", files["record.json"], dict)
            check(kind, folder, files)
            out[kind].append(Record(kind, folder.name, meta, files))
    return out


# -- rendering --------------------------------------------------------------------------------

def provenance(r: Record) -> str:
    m = r.meta
    if m.get("rows_from"):
        runs = "; ".join(f"{', '.join(e['rows'])}: run {e['date']} (`{e['source']}`), `{e['command']}`"
                         for e in m["rows_from"])
        return (f"_Rows from several runs: {runs}; versions: {m.get('versions', '?')}. "
                f"Recorded in `findings/{r.kind}/{r.name}/`._")
    part = f" ({m['part']})" if m.get("part") else ""
    return (f"_Run {m.get('date', '?')} (`{m.get('source', '?')}`); "
            f"command: `{m.get('command', '?')}`{part}; versions: {m.get('versions', '?')}. "
            f"Recorded in `findings/{r.kind}/{r.name}/`._")


def repro_columns(cells: list[dict]) -> list[str]:
    """The repros of a matrix run, in the order they ran."""
    columns: list[str] = []
    for c in cells:
        columns += [name for name in c.get("results") or {} if name not in columns]
    return columns


def tally(cells: list[dict], columns: list[str]) -> str:
    """Per repro: how many of the cells that ran gave which verdict."""
    parts = []
    for col in columns:
        verdicts = [c["results"][col]["verdict"] for c in cells
                    if not c.get("skipped") and col in c["results"]]
        counts = ", ".join(f"{v} {verdicts.count(v)}" for v in sorted(set(verdicts)))
        parts.append(f"`{col}`: {counts} (of {len(verdicts)} cells)")
    return "; ".join(parts)


def matrix_table(r: Record, columns: list[str] | None = None, ran_only: bool = False) -> str:
    """The matrix run's table as `nox -s repro` prints it (``columns``: only those repros;
    ``ran_only``: without the cells that were not run)."""
    cells = r.json("summary.json")
    if ran_only:
        cells = [c for c in cells if not c.get("skipped")]
    return results.summary_markdown(cells, columns or repro_columns(cells))


def bisect_answer(r: Record) -> str:
    """The answer of a bisect report: what comes before its recipe to reproduce it."""
    return r.files["report.md"].split("Reproduce the bisect")[0].replace("## Bisect result", "", 1).strip()


CORPUS = ROOT / "tests" / "corpus" / "cases.toml"
CORPUS_PREFIX = "corpus-"  # bisect records of the corpus: one table, not a section each


def corpus_table(records: list[Record]) -> list[str]:
    """The corpus runs (records named ``corpus-<case>-torch<mode>``) against the culprits the
    cases name (``tests/corpus/cases.toml``): found or not, steps, time."""
    import tomllib

    cases = {c["name"]: c for c in tomllib.loads(CORPUS.read_text())["case"]} if CORPUS.exists() else {}
    lines = ["### Corpus of real regressions (`tests/corpus`, `tests/test_corpus.py`)", "",
             "Each case bisected from its user-style script as a user would run it "
             "(`nox -s bisect -- --script tests/corpus/<case>.py --signature ... --repo <checkout>`), "
             "with the torch of each release's day (`auto`) and with one fixed torch; right when the "
             "commit named is the culprit upstream named (or the same change's other cherry-pick).", "",
             "| case | torch | releases: last good -> first bad | first bad commit | right? | steps "
             "(releases + commits) | s | notes |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        report = r.json("report.json")
        rest = r.name[len(CORPUS_PREFIX):]
        case_name, _, mode = rest.rpartition("-torch")
        case = cases.get(case_name, {})
        rel = (report.get("releases") or {}).get("outcome") or {}
        com = (report.get("commits") or {}).get("outcome") or {}
        commits = {c["sha"]: c for c in (report.get("commits") or {}).get("commits", [])}
        first = commits.get(com.get("first_bad") or "", {})
        named = f"`{first['sha'][:10]}` {first['subject'][:70]}" if first else f"({report.get('status')})"
        right = bool(first) and (any(first["sha"].startswith(c) for c in case.get("culprits", ()))
                                 or f"(#{case.get('pr')})" in first.get("subject", ""))
        ran = lambda o: sum(1 for s in o.get("steps", []) if not s.get("cached"))  # noqa: E731
        seconds = report.get("seconds")
        if seconds is None:
            found = re.search(r"; (\d+) s\.", r.files["report.md"])
            seconds = found and int(found.group(1))
        notes = []
        if "Not monotonic" in r.files["report.md"]:
            notes.append("not monotonic (said)")
        untestable = re.findall(r"(\d+) could not be tested", r.files["report.md"])
        if any(int(n) for n in untestable):
            notes.append(f"{sum(int(n) for n in untestable)} untestable (said)")
        lines.append(f"| {case_name} | {mode} | {rel.get('last_good')} -> {rel.get('first_bad')} | {named} | "
                     f"{'yes' if right else '**no**'} | {ran(rel)} + {ran(com)} | "
                     f"{f'{float(seconds):.0f}' if seconds else '?'} | "
                     f"{', '.join(notes)} |")
    found = sum("| yes |" in line for line in lines)
    lines += ["", f"{found} of {len(records)} runs named the culprit.", ""]
    for r in records:
        lines += [f"<details><summary>{r.name}</summary>", "", provenance(r), "",
                  bisect_answer(r), "", "</details>", ""]
    return lines


def section(r: Record) -> list[str]:
    lines = [f"### {r.name}", "", provenance(r), ""]
    if r.kind == "repro":
        cells = r.json("summary.json")
        lines += [f"Verdicts per repro: {tally(cells, repro_columns(cells))}.", "", matrix_table(r)]
    elif r.kind == "bisect":
        lines += [r.files["report.md"].replace("## Bisect result", "", 1).strip(), ""]
    else:
        lines += [r.files["summary.md"]]
    return lines


def not_recorded(kind: str) -> str:
    record_it = f"nox -s findings -- --record {kind}" + ("=DIR" if kind in ("stress", "triage") else "")
    return f"Not recorded yet: run `{HOW[kind]}` then `{record_it}`."


def render(data: Path | None = None) -> str:
    records = load(data)
    lines = ["# Findings", "",
             "Generated by `nox -s findings` from the recorded runs in `findings/`: do not edit by hand. "
             "To update a table, run it again and record the run: "
             "`nox -s findings -- --record KIND[=RUN_DIR]` (see docs/findings.md).", ""]
    for kind in KINDS:
        lines += [f"## {TITLES[kind]}", ""]
        if not records[kind]:
            lines += [not_recorded(kind), ""]
        corpus = [r for r in records[kind] if kind == "bisect" and r.name.startswith(CORPUS_PREFIX)]
        for r in records[kind]:
            if r not in corpus:
                lines += section(r)
        if corpus:
            lines += corpus_table(corpus)
    return "\n".join(lines).rstrip() + "\n"


# -- what the issue comments and PR bodies quote ----------------------------------------------

def quote(scripts: list[str], columns: list[str], data: Path | None = None) -> str:
    """The recorded evidence about the repros ``scripts`` (paths as in ``X-Repro``): the matrix
    rows of their ``columns``, the stress tables (for the stress script) and the bisect answers,
    each with its provenance; the same tables as FINDINGS.md. Empty when nothing is recorded."""
    records = load(data)
    names = {Path(s).name for s in scripts}
    lines: list[str] = []
    for r in records["repro"]:
        mine = [c for c in repro_columns(r.json("summary.json")) if c in columns]
        if mine:
            lines += [f"**Unpatched releases** ({r.name}): {provenance(r)}", "",
                      matrix_table(r, mine, ran_only=True)]
    if Path(STRESS_SCRIPT).name in names:
        for r in records["stress"]:
            lines += [f"<details><summary>Stress scenarios, cell {r.name}</summary>", "", provenance(r), "",
                      r.files["summary.md"], "</details>", ""]
    for r in records["bisect"]:
        if Path(r.meta.get("repro", "")).name in names:
            lines += [f"**Bisect** ({r.name}): {provenance(r)}", "", bisect_answer(r), ""]
    return "\n".join(lines).strip()


def bad_versions(columns: list[str], data: Path | None = None) -> list[dict]:
    """The recorded versions of every cell where one of ``columns`` was bad."""
    out = []
    for r in load(data)["repro"]:
        for c in r.json("summary.json"):
            hits = [c["results"][col] for col in columns if col in (c.get("results") or {})
                    and c["results"][col]["verdict"] == "bad"]
            if hits and not c.get("skipped"):
                v = (hits[0].get("record") or {}).get("versions") or {}
                out.append({"package": c["cell"]["package"],
                            "lightning": c.get("lightning_installed") or c["cell"]["lightning"],
                            "torch": c.get("torch_installed") or c["cell"]["torch"],
                            "python": v.get("python", "?")})
    return out


# -- the program ------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = contract.Parser(prog="nox -s findings --", description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="append", default=[], metavar="KIND[=RUN_DIR]",
                   help=f"record a run first ({', '.join(KINDS)}; default RUN_DIR: results/KIND/latest)")
    p.add_argument("--name", help="the record's name (one --record only; default: per kind)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when FINDINGS.md is not what the recorded data gives")
    try:
        a = p.parse_args(argv)
        if a.name and len(a.record) != 1:
            raise BadInput("--name goes with exactly one --record")
        if a.check and a.record:
            raise BadInput("--check records nothing: give it alone")
        todo = [parse_record(spec) for spec in a.record]  # every spec checked before any is recorded
        for kind, run_dir in todo:
            try:
                where = record(kind, run_dir, a.name)
            except OSError as err:  # an unwritable or broken data folder
                raise BadInput(f"cannot record into {_source(DATA)}: {err.strerror or err}") from None
            print(f"recorded {kind} {_source(Path(run_dir).resolve())} as {_source(where)}/")
        text = render()
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        return contract.USAGE
    if a.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.name} is not what the recorded data gives: run `nox -s findings`",
                  file=sys.stderr)
            return 1
        print(f"{OUTPUT.name} is up to date")
        return 0
    try:
        results.write_atomic(OUTPUT, text)
    except OSError as err:
        print(f"error: cannot write {OUTPUT.name}: {err.strerror or err}", file=sys.stderr)
        return contract.USAGE
    print(f"wrote {OUTPUT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
