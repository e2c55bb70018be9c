"""What a patch's description claims, and what backs each claim: the gate "claims" of
``nox -s patches``, and the checked list ``nox -s pr`` prints and puts in the PR body.

``patches/claims.toml`` lists, per patch file, its behavioural claims about Lightning or torch.
Each claim quotes the description (``says``: words that must still be in it, so a claim cannot
outlive the text it backs) and names one piece of evidence:

- ``test = "path::name"``: a test the patch adds, which passed with the patch (in the run of its
  test files, or in a run of the flaky gate, which must pass in every run anyway);
- ``line = "path:N"`` and ``quote = "..."``: line N of that file at master holds the quote (a
  Lightning path read from the checkout's master, without the series; ``torch/...`` in the torch
  of the upstream test environment);
- ``run = "findings/..."``: a recorded run of the workspace (a folder with its ``record.json``);
- ``commit = "<sha>"`` and ``quote = "..."``: that commit of the checkout (where a claim says a
  change came in) adds a line holding the quote.

A claim may also say what user-visible state it shows survives (``kept = "..."``): the gate
"behaviour kept" requires one, backed by a test, of every patch whose source changes wrap the
model again or restore state (``STATEFUL``: a call of ``configure_ddp(`` or
``DistributedDataParallel(``, a new ``on_load_checkpoint`` or ``load_state_dict``).

A Lightning patch with no claim listed fails the gate "claims", as does a claim whose words left the
description or whose evidence does not hold. The torch patch's claims are not checked (no torch
checkout here): the gate says so.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tools.core import contract
from tools.series import patches

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("test", "line", "run", "commit")
STATEFUL = re.compile(r"configure_ddp\(|DistributedDataParallel\(|def on_load_checkpoint\b|"
                      r"def load_state_dict\b|\.load_state_dict\(")


class BadInput(contract.BadInput):
    """``claims.toml`` cannot be read as claims (one line, exit 2)."""


def load(path: Path | None = None) -> dict[str, list[dict]]:
    """The claims per patch file name (``patches/claims.toml``); every entry checked for its shape."""
    path = path or patches.PATCHES / "claims.toml"
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise BadInput(f"{path.name}: not TOML ({err})") from None
    for patch, claims in data.items():
        if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
            raise BadInput(f"{path.name}: {patch} is not a list of claims ([[\"{patch}\"]] tables)")
        for n, c in enumerate(claims, 1):
            kinds = [k for k in KINDS if k in c]
            if not isinstance(c.get("says"), str) or not c["says"].strip() or len(kinds) != 1:
                raise BadInput(f"{path.name}: {patch} claim {n} needs `says` and one of "
                               f"{', '.join(KINDS)}")
            if "line" in c and not re.fullmatch(r"[^:]+:\d+", c["line"]):
                raise BadInput(f"{path.name}: {patch} claim {n}: `line` is path:N")
            if ("line" in c or "commit" in c) and not isinstance(c.get("quote"), str):
                raise BadInput(f"{path.name}: {patch} claim {n}: `{kinds[0]}` needs a `quote`")
    return data


def words(text: str) -> str:
    return " ".join(text.split())


def passed(node: str, outcomes: list[dict[str, str]]) -> bool:
    """``node`` (or each of its parametrized cases) passed in one of the runs ``outcomes``."""
    for run in outcomes:
        cases = [o for n, o in run.items() if n == node or n.startswith(node + "[")]
        if cases and all(o == "passed" for o in cases):
            return True
    return False


def check(claim: dict, description: str, added: set[str], outcomes: list[dict[str, str]], tree: Path | None,
          torch_root: Path | None, repo=None, root: Path = ROOT, master: str | None = None) -> str | None:
    """Why ``claim`` does not hold (None when it does). A Lightning line is read at ``master`` in
    ``repo`` when both are given (the trees the gates run in have the earlier patches applied),
    else in ``tree``."""
    if words(claim["says"]) not in words(description):
        return "its words are no longer in the description"
    if "test" in claim:
        node = claim["test"]
        if node not in added:
            return f"{node} is no test the patch adds"
        return None if passed(node, outcomes) else f"{node} did not pass with the patch"
    if "run" in claim:
        return None if (root / claim["run"] / "record.json").is_file() else f"no recorded run {claim['run']}"
    if "commit" in claim:
        if repo is None:
            return "no checkout to read the commit in"
        try:
            shown = repo.git.show("--format=", claim["commit"])
        except Exception:  # noqa: BLE001  (an unknown commit, a broken object: the claim fails)
            return f"no commit {claim['commit']} in the checkout"
        added_lines = [line for line in shown.splitlines() if line.startswith("+")]
        return None if any(claim["quote"] in line for line in added_lines) else \
            f"commit {claim['commit']} adds no line holding {claim['quote']!r}"
    path, _, n = claim["line"].rpartition(":")
    try:
        if not path.startswith("torch/") and repo is not None and master:
            lines = repo.git.show(f"{master}:{path}").splitlines()
        else:
            base = torch_root if path.startswith("torch/") else tree
            if base is None:
                return f"{path}: no tree to read it in"
            lines = (base / path).read_text(encoding="utf-8").splitlines()
    except Exception:  # noqa: BLE001  (no such file there, unreadable: the claim fails)
        return f"{path}: no such file at master"
    line = lines[int(n) - 1] if 0 < int(n) <= len(lines) else ""
    return None if claim["quote"] in line else f"{claim['line']} does not hold {claim['quote']!r}"


def evidence(claim: dict) -> str:
    if "test" in claim:
        return f"test `{claim['test']}`"
    if "run" in claim:
        return f"recorded run `{claim['run']}`"
    if "commit" in claim:
        return f"commit `{claim['commit']}` adds `{claim['quote']}`"
    return f"`{claim['line']}`: `{claim['quote']}`"


def gate(patch_name: str, description: str, claims: list[dict], added: set[str],
         outcomes: list[dict[str, str]], tree: Path | None, torch_root: Path | None, repo=None,
         master: str | None = None) -> dict:
    """The gate's ``{"ok", "text", "details": {"claims"}}``: every claim listed, each backed."""
    if not claims:
        return {"ok": False, "text": f"no claim of {patch_name} is listed in patches/claims.toml"}
    checked = [{"says": c["says"], "evidence": evidence(c), **({"kept": c["kept"]} if "kept" in c else {}),
                "fails": check(c, description, added, outcomes, tree, torch_root, repo, master=master)}
               for c in claims]
    bad = [c for c in checked if c["fails"]]
    kinds = {k: sum(k in c for c in claims) for k in KINDS}
    text = (f"{len(claims)} claims, each backed ({kinds['test']} by tests, {kinds['line']} by cited lines, "
            f"{kinds['run']} by recorded runs, {kinds['commit']} by commits)")
    if bad:
        text = f"{len(bad)} of {len(claims)} claims not backed: " + "; ".join(
            f"\"{words(c['says'])[:60]}\": {c['fails']}" for c in bad)
    return {"ok": not bad, "text": text, "details": {"claims": checked}}


def listing(claims: list[dict]) -> list[str]:
    """The claims as markdown list items, each with its evidence (the PR body, ``nox -s pr``)."""
    return [f"- \"{words(c['says'])}\": {evidence(c)}" for c in claims]


def stateful(patch: patches.Patch) -> list[str]:
    """What the patch's source changes (tests and CHANGELOGs aside) add that wraps the model again
    or restores state."""
    found = []
    for path, section in patch.sections().items():
        if path.startswith(("tests/", "test/")) or "CHANGELOG" in path:
            continue
        for line in section.splitlines():
            if line.startswith("+") and not line.startswith("+++") and (m := STATEFUL.search(line)):
                found.append(m.group(0))
    return sorted(set(found))


def kept_gate(patch: patches.Patch, claims_gate: dict) -> dict:
    """Behaviour kept: a patch that wraps the model again or restores state shows, by a test, what
    user-visible state survives (a claim with ``kept`` whose test holds)."""
    what = stateful(patch)
    if not what:
        return {"ok": True, "text": "it neither wraps the model again nor restores state"}
    checked = (claims_gate.get("details") or {}).get("claims", [])
    kept = [c for c in checked if c.get("kept") and c["evidence"].startswith("test ") and not c["fails"]]
    calls = ", ".join(f"`{w}`" for w in what)
    if not kept:
        return {"ok": False, "text": f"it adds {calls}, and no claim with `kept` backed by a passing test "
                                     "shows what user-visible state survives"}
    return {"ok": True, "text": f"it adds {calls}; kept: " + "; ".join(
        f"{c['kept']} ({c['evidence'].removeprefix('test ')})" for c in kept)}
