"""The bisection engine: ordered candidates, a predicate following the verdict contract.

Independent of what a candidate is (a release, a commit): ``test(candidate)`` returns
``(code, reason)`` or ``(code, reason, final)``: a contract code (0 good, 1 bad, 125 skip, >= 128
stop) and whether it is the repro's own verdict (``final``; a timeout, a kill or an environment
that could not be made is not, and is tried again next time). Final verdicts are cached in a JSON
state file after each completed step, so an interrupted run resumes without repeating one; an
interrupted step records nothing. Several runs may share one state file: each write merges under
a lock. Skipped candidates are stepped around as ``git bisect`` does.

With ``fix=True`` it looks for the first candidate *without* the bug after one with it, as
``git bisect start --term-old=broken --term-new=fixed`` does: the engine's own "good" (the old
state) is then "the bug is there", and its "bad" (the new state) is "fixed". The cache keeps the
repro's own verdicts either way, so a fix bisect and a regression bisect share their runs.

With ``jobs=K`` (> 1) each round tests K candidates at once, in threads, spread evenly over the
range (and, searching back, the next K doubling distances): N candidates take about
ceil(log_{K+1} N) rounds instead of log2 N steps. ``test`` must then be safe to call from
several threads (its runs fresh processes). An interrupt stops the runs of the round
(``process_group.ABORT``); the verdicts of the steps that ended stay cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.core import contract
from tools.core.results import write_json
from tools.launch import process_group

HarnessFailure = contract.HarnessFailure  # a predicate answered >= 128: the bisect must stop


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
    status: str  # found | no-good | ambiguous | untestable
    first_bad: str | None = None
    last_good: str | None = None
    skipped_between: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    range_size: int = 0
    why: str | None = None  # untestable: what could not be tested, and why
    non_monotonic: list[str] = field(default_factory=list)  # "good at X, newer than bad Y"
    ends: dict = field(default_factory=dict)  # "bad"/"good" -> {candidate, bad, runs}: the rates

    def to_dict(self) -> dict:
        return asdict(self)

    def tally(self) -> dict[str, list[str]]:
        """Each candidate tested once, by its last verdict: good, bad, untestable."""
        last = {s.candidate: s for s in self.steps}
        out = {"good": [], "bad": [], "untestable": []}
        for c, s in last.items():
            out["untestable" if s.verdict == "skip" else s.verdict].append(c)
        return out


class State:
    """Verdicts by key, in a JSON file shared by every run that names it.

    Each ``put`` re-reads the file and merges under an exclusive lock (``<file>.lock``) before
    writing it atomically: two bisects on one state file never lose each other's verdicts.
    """

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self.data: dict = self._read() if self.path else {}

    def _read(self) -> dict:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as err:
            raise contract.BadInput(f"state file {self.path}: cannot read it ({err})") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise contract.BadInput(f"state file {self.path} is not JSON: move it away or give "
                                    "another --state") from None
        problem = _invalid(data)
        if problem:
            raise contract.BadInput(f"state file {self.path} is not a bisect state ({problem}): "
                                    "move it away or give another --state")
        return data

    def check_writable(self) -> None:
        """Fail before the first step, not after it (its verdict would be lost)."""
        if self.path:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self._lock_path(), "a"):
                    pass
            except OSError as err:
                raise contract.BadInput(f"state file {self.path}: cannot write there "
                                        f"({err.strerror})") from None

    def _lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def get(self, key: str) -> dict | None:
        return self.data.get(key)

    def put(self, key: str, value: dict) -> None:
        self.data[key] = value
        if not self.path:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._lock_path(), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                merged = {**self._read(), key: value}  # what other runs wrote meanwhile stays
                write_json(self.path, merged)  # a temporary file, fsync'd, renamed: all or nothing
                self.data = {**merged, **self.data}
        except OSError as err:  # a full or read-only disk: the file still holds the earlier steps
            raise contract.HarnessFailure(
                f"cannot save the verdict in the state file {self.path} ({err.strerror}); the "
                "verdicts of the steps before it are kept there: make room and run the same command "
                "to resume") from None


def _invalid(data) -> str | None:
    """Why ``data`` is not a state (verdicts by key), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, entry in data.items():
        if not (isinstance(entry, dict) and entry.get("verdict") in ("good", "bad", "skip")
                and isinstance(entry.get("codes"), list)
                and all(isinstance(c, int) for c in entry["codes"])
                and isinstance(entry.get("seconds"), int | float)):
            return f"entry {key[:60]!r} is not a verdict record"
    return None


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
        raise contract.BadInput("the bug was never reproduced at the bad end")
    return min(cap, math.ceil(math.log(miss) / math.log(1 - rate)))


class Bisector:
    def __init__(self, candidates: Sequence[str], test: Callable[[str], tuple[int, str | None]],
                 key: Callable[[str], str], state: State, trials: int = 1,
                 log: Callable[[str], None] = print, label: Callable[[str], str] = str,
                 fix: bool = False, jobs: int = 1, round_scope: Callable | None = None):
        self.candidates = list(candidates)
        # a round's context (K probes -> one with ``leave()``, called as each probe ends): the
        # SLURM executor's job array per round (``slurm_jobs.array_round``)
        self.round_scope = round_scope
        self.fix = fix
        self.jobs = max(1, jobs)
        self.rounds = 0  # rounds of parallel probes (jobs > 1)
        self.label = label
        self.test, self.key, self.state = test, key, state
        self.trials = trials
        self.log = log
        self.steps: list[Step] = []
        self.rate: float | None = None  # with --trials auto: the bug's rate at the bad end
        self.started = time.monotonic()

    # -- one candidate -------------------------------------------------------------------
    def verdict(self, candidate: str, trials: int | None = None, every: bool = False) -> str:
        """good / bad / skip of ``candidate`` over ``trials`` runs: a bad run ends the step, unless
        ``every`` (the ends: their rate is reported, so every run is made)."""
        trials = trials or self.trials
        key = self.key(candidate)
        cached = self.state.get(key)
        if cached and (len(cached["codes"]) >= trials or cached["verdict"] == "bad" and not every):
            step = Step(candidate, self.term(cached["verdict"]), cached["codes"], cached["seconds"], True,
                        cached.get("reason"))
            self.steps.append(step)
            self.log(f"  {self.label(candidate)}: {self.said(step.verdict)} (cached)")
            return step.verdict
        codes, reasons, start, final = [], [], time.monotonic(), True
        for _ in range(trials):
            code, reason, ok = self.run_once(candidate)
            codes.append(code)
            reasons.append(reason)
            final = final and ok
            if code == contract.BAD and not every:
                break
        verdict = combine(codes)
        seconds = round(time.monotonic() - start, 1)
        reason = next((r for c, r in zip(codes, reasons, strict=True) if c != contract.GOOD and r),
                      None)
        if final or verdict == "bad":  # a bad run is the bug seen: final whatever the others did
            self.state.put(key, {"verdict": verdict, "codes": codes, "seconds": seconds,
                                 "reason": reason})
        elif verdict == "skip":
            reason = f"{reason} (not cached: tried again next time)"
        verdict = self.term(verdict)
        self.steps.append(Step(candidate, verdict, codes, seconds, False, reason))
        self.log(f"  {self.label(candidate)}: {self.said(verdict)} ({seconds:.0f} s)"
                 f"{f' - {reason}' if reason else ''}")
        return verdict

    def term(self, verdict: str) -> str:
        """The repro's verdict (bad: the bug seen) as the engine's term: swapped in a fix bisect."""
        if self.fix and verdict in ("good", "bad"):
            return "bad" if verdict == "good" else "good"
        return verdict

    @property
    def words(self) -> dict[str, str]:
        """The engine's terms (the old state, the new state) as the user reads them."""
        return {"good": "with the bug", "bad": "fixed"} if self.fix else {"good": "good", "bad": "bad"}

    def said(self, verdict: str) -> str:
        """The engine's term in the user's words."""
        return self.words.get(verdict, verdict)

    def end(self, which: str) -> str:
        """An end by the engine's term, in the user's words: "the bad end", "the end with the bug"."""
        if not self.fix:
            return f"{which} end"
        return "end with the bug" if which == "good" else "fixed end"

    def run_once(self, candidate: str) -> tuple[int, str | None, bool]:
        answer = self.test(candidate)
        code, reason, final = (*answer, True) if len(answer) == 2 else answer
        if code >= contract.FAIL:
            raise HarnessFailure(f"{candidate}: {reason or f'exit {code}'}")
        return code, reason, final

    def auto_trials(self, bad: str, runs: int = 5) -> int:
        """``--trials auto``: run the bad end ``runs`` times (cached like any verdict), estimate
        the rate p at which the bug shows, and use enough trials per step to miss a bad
        candidate with probability <= 1 %. Sets ``self.trials`` and ``self.rate``."""
        key = f"{self.key(bad)}|auto-trials"
        cached = self.state.get(key)
        if cached and len(cached["codes"]) >= runs:
            codes = cached["codes"][:runs]
        else:
            codes, start = [], time.monotonic()
            for _ in range(runs):
                code, _, final = self.run_once(bad)
                if not final:
                    raise HarnessFailure(f"--trials auto: a run at the bad end {bad} could not be "
                                         "judged (timeout or kill); give --trials N")
                codes.append(code)
            self.state.put(key, {"verdict": combine(codes), "codes": codes,
                                 "seconds": round(time.monotonic() - start, 1), "reason": None})
        self.rate = codes.count(contract.BAD) / runs
        self.trials = trials_for(self.rate)
        self.log(f"[trials auto] bug seen in {codes.count(contract.BAD)}/{runs} runs at "
                 f"{self.label(bad)}: p = {self.rate:.2f}, N = {self.trials} runs per step "
                 f"(a bad step is missed with probability {(1 - self.rate) ** self.trials:.3f})")
        return self.trials

    # -- the search ----------------------------------------------------------------------
    def _index_verdicts(self) -> dict[int, str]:
        position = {c: i for i, c in enumerate(self.candidates)}
        return {position[s.candidate]: s.verdict for s in self.steps if s.candidate in position}

    def _neighbour(self, index: int, low: int, high: int, tries: int = 2) -> tuple[int, str]:
        """After a skip at ``index``: its untested neighbours within (``low`` - 1, ``high``), older
        and newer in turn, as ``git bisect skip`` moves to a candidate near the skipped one."""
        tested = self._index_verdicts()
        for k in range(1, tries + 1):
            for near in (index - k, index + k):
                if low <= near < high and near not in tested:
                    verdict = self.verdict(self.candidates[near])
                    if verdict != "skip":
                        return near, verdict
                    tested[near] = verdict
        return index, "skip"

    def probe(self, indexes: list[int]) -> dict[int, str]:
        """One round: the verdicts of ``indexes``, tested at once (one thread each)."""
        self.rounds += 1
        names = [self.candidates[i] for i in indexes]
        elapsed = time.monotonic() - self.started
        self.log(f"[round {self.rounds}] testing {len(names)} at once: "
                 + ", ".join(self.label(n) for n in names) + f", elapsed {elapsed:.0f} s")
        scope = self.round_scope(len(names)) if self.round_scope else contextlib.nullcontext()
        with scope as gathered:
            def one(name: str) -> str:
                try:
                    return self.verdict(name)
                finally:
                    if gathered is not None:  # the others no longer wait for this probe's runs
                        gathered.leave()

            pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="probe")
            futures = [pool.submit(one, n) for n in names]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)  # a harness failure ends the round now
                verdicts = [f.result() for f in futures]
            except BaseException:  # Ctrl-C, SIGTERM, a harness failure: stop the round's runs
                process_group.ABORT.set()
                raise
            finally:
                pool.shutdown(wait=True)
                process_group.ABORT.clear()
        return dict(zip(indexes, verdicts, strict=True))

    def search_good(self, bad: int) -> tuple[int | None, int]:
        """Backwards from ``bad`` at doubling distance: (the index of a good candidate or None,
        the index of the oldest bad one seen above it). After a skip its neighbours are tried."""
        if self.jobs > 1:
            return self._search_good_parallel(bad)
        distance, nearest_bad = 1, bad
        while True:
            index = max(bad - distance, 0)
            self.log(f"[search back] {self.label(self.candidates[index])} ({distance} before "
                     f"{self.label(self.candidates[bad])})")
            verdict = self.verdict(self.candidates[index])
            if verdict == "skip":
                self.log(f"[search back] {self.label(self.candidates[index])} could not be tested: "
                         "trying its neighbours")
                index, verdict = self._neighbour(index, 0, nearest_bad)
            if verdict == "good":
                return index, nearest_bad
            if verdict == "bad":
                nearest_bad = min(nearest_bad, index)
            if bad - distance <= 0:
                return None, nearest_bad
            distance *= 2

    def _search_good_parallel(self, bad: int) -> tuple[int | None, int]:
        """The search back, ``jobs`` doubling distances a round: (the newest good one found or
        None, the oldest bad one newer than it)."""
        distances = (2 ** n for n in itertools.count())
        done = False
        while True:
            indexes: list[int] = []
            while len(indexes) < self.jobs and not done:
                index = max(bad - next(distances), 0)
                if index not in indexes:
                    indexes.append(index)
                done = index == 0
            self.probe(indexes)
            seen = self._index_verdicts()
            goods = [i for i, v in seen.items() if v == "good" and i < bad]
            if goods or done:
                good = max(goods) if goods else None
                above = [i for i, v in seen.items() if v == "bad" and (good is None or i > good)]
                return good, min([bad, *above])

    def _round(self, good: int, bad: int, untested: list[int]) -> dict[int, str]:
        """The next verdicts between ``good`` and ``bad``: the middle one, or, with ``jobs`` > 1,
        that many spread evenly over what is left, tested at once."""
        label = lambda i: self.label(self.candidates[i])  # noqa: E731
        if self.jobs > 1:
            k = min(self.jobs, len(untested))
            picks = sorted({untested[(len(untested) * (j + 1)) // (k + 1)] for j in range(k)})
            self.log(f"[~{math.ceil(math.log(len(untested) + 1, k + 1))} rounds left] {len(untested)} "
                     f"candidates between {label(good)} and {label(bad)}")
            return self.probe(picks)
        middle = (good + bad) / 2
        index = min(untested, key=lambda i: (abs(i - middle), i))
        self.log(f"[step {len(self.steps) + 1}, ~{math.ceil(math.log2(len(untested) + 1))} left] "
                 f"{len(untested)} candidates between {label(good)} and {label(bad)}; testing "
                 f"{label(index)}, elapsed {time.monotonic() - self.started:.0f} s")
        return {index: self.verdict(self.candidates[index])}

    def bisect(self, good: int, bad: int) -> Outcome:
        """Between a verified good index and a verified bad index (good < bad)."""
        skipped: set[int] = set()
        size = bad - good - 1
        while True:
            untested = [i for i in range(good + 1, bad) if i not in skipped]
            if not untested:
                break
            seen = self._round(good, bad, untested)
            skipped |= {i for i, v in seen.items() if v == "skip"}
            bad = min([bad, *(i for i, v in seen.items() if v == "bad")])
            good = max([good, *(i for i, v in seen.items() if v == "good" and i < bad)])
        between = [self.candidates[i] for i in sorted(skipped) if good < i < bad]
        return Outcome("ambiguous" if between else "found", self.candidates[bad],
                       self.candidates[good], between, self.steps, size)

    def _end(self, index: int, want: str) -> tuple[str, dict]:
        """Verify one end with every trial run: its verdict and its rate for the report."""
        candidate = self.candidates[index]
        self.log(f"[verify] {want} {self.label(candidate)}")
        verdict = self.verdict(candidate, every=True)
        codes = self.steps[-1].codes
        return verdict, {"candidate": candidate, "bad": codes.count(contract.BAD), "runs": len(codes)}

    def run(self, good: int | None, bad: int) -> Outcome:
        """Verify the ends (or search for a good one), then bisect. An end that cannot be tested
        (its environment cannot be made, it crashes otherwise) is no verdict on the bug: the
        outcome is then "untestable", with the reason."""
        new, old = self.end("bad"), self.end("good")
        verdict, bad_end = self._end(bad, new)
        if verdict == "skip":
            return self._finish(Outcome("untestable", self.candidates[bad], None, [], self.steps,
                                        why=f"the {new} {self.candidates[bad]} could not be "
                                            f"tested{self._why()}"), {"bad": bad_end})
        if verdict != "bad":
            shown = "still shows the bug" if self.fix else "does not show the bug"
            raise contract.BadInput(f"the {new} {self.candidates[bad]} {shown} "
                                    f"({self.said(self.steps[-1].verdict)}{self._why()})")
        ends, searched = {"bad": bad_end}, False
        if good is None:
            good, bad = self.search_good(bad)
            if good is None:
                tally = Outcome("", steps=self.steps).tally()
                if tally["untestable"]:
                    return self._finish(Outcome(
                        "untestable", self.candidates[bad], None, [], self.steps, bad + 1,
                        why=(f"no {'good ' if not self.fix else ''}release found"
                             f"{' with the bug' if self.fix else ''} among the {len(tally['bad'])} "
                             f"testable ones; {len(tally['untestable'])} could not run")), ends)
                return self._finish(Outcome("no-good", self.candidates[bad], None, [], self.steps,
                                            bad + 1), ends)
            codes = self.steps_of(self.candidates[good])[-1].codes
            ends["good"] = {"candidate": self.candidates[good], "bad": codes.count(contract.BAD),
                            "runs": len(codes)}
            searched = True
        else:
            verdict, ends["good"] = self._end(good, old)
            if verdict == "skip":
                return self._finish(Outcome("untestable", self.candidates[bad], None, [], self.steps,
                                            why=f"the {old} {self.candidates[good]} could not "
                                                f"be tested{self._why()}"), ends)
            if verdict != "good":
                shown = "does not show the bug" if self.fix else "is not good"
                raise contract.BadInput(f"the {old} {self.candidates[good]} {shown} "
                                        f"({self.said(self.steps[-1].verdict)}{self._why()})")
        outcome = self.bisect(good, bad)
        if searched and good > 0 and 0 not in self._index_verdicts():
            # the search stopped at the first good candidate it met: one look at the oldest tells
            # whether the bug also existed before that (it comes and goes)
            self.log(f"[order check] the oldest candidate {self.label(self.candidates[0])}")
            self.verdict(self.candidates[0])
        return self._finish(outcome, ends)

    def steps_of(self, candidate: str) -> list[Step]:
        return [s for s in self.steps if s.candidate == candidate]

    def _finish(self, outcome: Outcome, ends: dict) -> Outcome:
        """The rates at the ends, and whether the verdicts seen order as a regression should."""
        outcome.ends = ends
        seen = self._index_verdicts()
        bads = sorted(i for i, v in seen.items() if v == "bad")
        later = [i for i, v in sorted(seen.items()) if v == "good" and bads and i > bads[0]]
        if later:  # the oldest bad, and the good ones newer than it
            more = f" (and {len(later) - 1} more)" if len(later) > 1 else ""
            outcome.non_monotonic.append(
                f"{self.words['good']} at {self.label(self.candidates[later[0]])}{more}, newer than "
                f"{self.words['bad']} {self.label(self.candidates[bads[0]])}")
        return outcome

    def _why(self) -> str:
        reason = self.steps[-1].reason
        return f": {reason}" if reason else ""
