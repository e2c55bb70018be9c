"""The bisection engine: ordered candidates, a predicate following the verdict contract.

Independent of what a candidate is (a release, a commit): ``test(candidate)`` returns a contract
code (0 good, 1 bad, 125 skip, >= 128 stop). Verdicts are cached in a JSON state file after each
completed step, so an interrupted run resumes without repeating one; an interrupted step records
nothing. Skipped candidates are stepped around as ``git bisect`` does.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools import contract
from tools.results import write_json


class HarnessFailure(RuntimeError):
    """A predicate answered >= 128: the bisect must stop."""


@dataclass
class Step:
    candidate: str
    verdict: str  # good | bad | skip
    codes: list[int]
    seconds: float
    cached: bool = False
    reason: str | None = None


@dataclass
class Outcome:
    status: str  # found | no-good | ambiguous
    first_bad: str | None = None
    last_good: str | None = None
    skipped_between: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    range_size: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class State:
    """Verdicts by key, in a JSON file written atomically after each one."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self.data: dict = {}
        if self.path and self.path.exists():
            self.data = json.loads(self.path.read_text())

    def get(self, key: str) -> dict | None:
        return self.data.get(key)

    def put(self, key: str, value: dict) -> None:
        self.data[key] = value
        if self.path:
            write_json(self.path, self.data)


def combine(codes: Sequence[int]) -> str:
    """Several trials of one candidate: bad if any is bad; good only if all are good."""
    if any(c == contract.BAD for c in codes):
        return "bad"
    if codes and all(c == contract.GOOD for c in codes):
        return "good"
    return "skip"


def trials_for(rate: float, miss: float = 0.01, cap: int = 20) -> int:
    """Trials so that a bad candidate shows the bug at least once with probability 1 - miss."""
    if rate >= 1:
        return 1
    if rate <= 0:
        raise ValueError("the bug was never reproduced at the bad end")
    return min(cap, math.ceil(math.log(miss) / math.log(1 - rate)))


class Bisector:
    def __init__(self, candidates: Sequence[str], test: Callable[[str], tuple[int, str | None]],
                 key: Callable[[str], str], state: State, trials: int = 1,
                 log: Callable[[str], None] = print, label: Callable[[str], str] = str):
        self.candidates = list(candidates)
        self.label = label
        self.test, self.key, self.state = test, key, state
        self.trials = trials
        self.log = log
        self.steps: list[Step] = []
        self.started = time.monotonic()

    # -- one candidate -------------------------------------------------------------------
    def verdict(self, candidate: str, trials: int | None = None) -> str:
        trials = trials or self.trials
        key = self.key(candidate)
        cached = self.state.get(key)
        if cached and len(cached["codes"]) >= trials or cached and cached["verdict"] == "bad":
            step = Step(candidate, cached["verdict"], cached["codes"], cached["seconds"], True,
                        cached.get("reason"))
            self.steps.append(step)
            self.log(f"  {self.label(candidate)}: {step.verdict} (cached)")
            return step.verdict
        codes, reasons, start = [], [], time.monotonic()
        for _ in range(trials):
            code, reason = self.test(candidate)
            if code >= contract.FAIL:
                raise HarnessFailure(f"{candidate}: {reason or f'exit {code}'}")
            codes.append(code)
            reasons.append(reason)
            if code == contract.BAD:
                break
        verdict = combine(codes)
        seconds = round(time.monotonic() - start, 1)
        reason = next((r for c, r in zip(codes, reasons, strict=True) if c != contract.GOOD and r),
                      None)
        self.state.put(key, {"verdict": verdict, "codes": codes, "seconds": seconds,
                             "reason": reason})
        self.steps.append(Step(candidate, verdict, codes, seconds, False, reason))
        self.log(f"  {self.label(candidate)}: {verdict} ({seconds:.0f} s)"
                 f"{f' - {reason}' if reason else ''}")
        return verdict

    # -- the search ----------------------------------------------------------------------
    def search_good(self, bad: int) -> int | None:
        """Backwards from ``bad`` at doubling distance; the index of a good candidate or None."""
        distance = 1
        while True:
            index = max(bad - distance, 0)
            self.log(f"[search back] {self.label(self.candidates[index])} ({distance} before "
                     f"{self.label(self.candidates[bad])})")
            if self.verdict(self.candidates[index]) == "good":
                return index
            if index == 0:
                return None
            distance *= 2

    def bisect(self, good: int, bad: int) -> Outcome:
        """Between a verified good index and a verified bad index (good < bad)."""
        skipped: set[int] = set()
        size = bad - good - 1
        while True:
            untested = [i for i in range(good + 1, bad) if i not in skipped]
            if not untested:
                break
            middle = (good + bad) / 2
            index = min(untested, key=lambda i: (abs(i - middle), i))
            remaining = len(untested)
            self.log(f"[step {len(self.steps) + 1}, ~{math.ceil(math.log2(remaining + 1))} left] "
                     f"{remaining} candidates between {self.label(self.candidates[good])} and "
                     f"{self.label(self.candidates[bad])}; testing "
                     f"{self.label(self.candidates[index])}, elapsed "
                     f"{time.monotonic() - self.started:.0f} s")
            verdict = self.verdict(self.candidates[index])
            if verdict == "good":
                good = index
            elif verdict == "bad":
                bad = index
            else:
                skipped.add(index)
        between = [self.candidates[i] for i in sorted(skipped) if good < i < bad]
        return Outcome("ambiguous" if between else "found", self.candidates[bad],
                       self.candidates[good], between, self.steps, size)

    def run(self, good: int | None, bad: int) -> Outcome:
        """Verify the ends (or search for a good one), then bisect."""
        self.log(f"[verify] bad end {self.label(self.candidates[bad])}")
        if self.verdict(self.candidates[bad]) != "bad":
            raise ValueError(f"the bad end {self.candidates[bad]} does not show the bug "
                             f"({self.steps[-1].verdict}{self._why()})")
        if good is None:
            good = self.search_good(bad)
            if good is None:
                return Outcome("no-good", self.candidates[bad], None, [], self.steps, bad + 1)
        else:
            self.log(f"[verify] good end {self.label(self.candidates[good])}")
            if self.verdict(self.candidates[good]) != "good":
                raise ValueError(f"the good end {self.candidates[good]} is not good "
                                 f"({self.steps[-1].verdict}{self._why()})")
        return self.bisect(good, bad)

    def _why(self) -> str:
        reason = self.steps[-1].reason
        return f": {reason}" if reason else ""
