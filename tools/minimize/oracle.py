"""The oracle: launch a candidate and judge it (interesting = bad with the original's signature,
at the same crash site; good on the control when there is one), its verdicts cached by content."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.core import contract, results
from tools.core.contract import BadInput, HarnessFailure
from tools.launch import harness
from tools.launch.launcher import How, Launcher, Run
from tools.minimize.options import AUTO_RUNS, CANDIDATE_TIMEOUT, SLOWER, VALUE_SITES, BudgetSpent, Config
from tools.minimize.passes.values import instrument, read_records
from tools.minimize.source import (
    call_mismatches,
    constants,
    crash_site,
    kept_statements,
    only_removes_statements,
    outside_source_lines,
    shown_size,
    size,
    static_rejection,
    unbound_names,
)
from tools.stages.bisect import State, trials_for

# -- the interestingness test --------------------------------------------------------------

@dataclass
class Stats:
    tests: int = 0  # launches
    cache_hits: int = 0
    static: int = 0  # rejected without a launch
    outcomes: dict = field(default_factory=dict)  # why candidates were not interesting, counted
    improvements: int = 0


class Oracle:
    """Judges candidates (file name -> source, None for a removed file), caching verdicts by
    content hash in ``state``, and keeps the smallest interesting candidate in ``out/best``."""

    def __init__(self, cfg: Config, original: dict[str, str], state: State, log=print):
        self.cfg, self.original, self.state, self.log = cfg, original, state, log
        self.kept = {n: d for n, s in original.items() if (d := kept_statements(s))}
        self.known = {n: (unbound_names(s), constants(s), call_mismatches(s)) for n, s in original.items()}
        self.site: tuple[str, ...] | None = None
        self.trials = cfg.trials if isinstance(cfg.trials, int) else 1
        self.stats = Stats()
        self.best = dict(original)
        self.best_size = size(original)
        self.started = time.monotonic()
        self.deadline: float | None = None
        self.run_limit: int | None = None  # stats.tests at which --max-runs is spent
        self.coarse = False  # the coarse pass: whole statements only
        self.shrinks = 0  # improvements that made the best smaller
        self.round_start = 0  # shrinks when the reducer's current round began
        self.timeout = cfg.timeout  # for the original; then from its duration (check_original)
        self.slowest = self.slow = None  # the original's slowest run; the limit of an interesting one
        # the candidates' runs: forks of one preloaded runner, a fresh interpreter with --fresh-process
        self.launcher = Launcher(How(fresh=cfg.fresh_process, runner_stderr=cfg.out / "preloaded.stderr",
                                     nodes=cfg.nodes[0], ranks_per_node=cfg.nodes[1]))
        self.control = None if cfg.control_python is None else Launcher(
            How(fresh=cfg.fresh_process, runner_stderr=cfg.out / "control.stderr", nodes=cfg.nodes[0],
                ranks_per_node=cfg.nodes[1]))
        (cfg.out / "runs").mkdir(parents=True, exist_ok=True)

    def key(self, files: dict[str, str | None]) -> str:
        payload = json.dumps([sorted(files.items()), self.cfg.signature, self.cfg.verdict_line,
                              str(self.cfg.python), list(self.cfg.args), self.trials, self.site,
                              self.cfg.fresh_process, self.timeout, self.cfg.check_replicas,
                              *([list(self.cfg.nodes)] if self.cfg.nodes[0] > 1 else []),
                              *([str(self.cfg.control_python), list(self.cfg.control_env)]
                                if self.control else [])])
        return hashlib.sha256(payload.encode()).hexdigest()

    # one launch
    def launch(self, files: dict[str, str | None], stem: str, fresh: bool,
               control: bool = False) -> tuple[harness.RunResult, str]:
        """Run the candidate once in a new folder (on the control with ``control``); its result
        and its output."""
        work = self.cfg.out / "work" / stem
        argv = [str(work / self.cfg.script.name), *self.cfg.args]
        log_stem = self.cfg.out / "runs" / stem
        signature = None if self.cfg.verdict_line else self.cfg.signature
        launcher, python = (self.control, self.cfg.control_python) if control else (self.launcher,
                                                                                     self.cfg.python)
        # the candidates' limit comes from the original's runs as forks: a fresh run also starts
        # its interpreters (seconds per rank on a busy machine), so it gets the original's limit
        timeout = self.cfg.timeout if fresh and not self.cfg.fresh_process else self.timeout
        try:  # the folder goes whenever an interrupt comes, while it is made included
            shutil.rmtree(work, ignore_errors=True)
            self.populate(work, files)
            # a fresh run is never a fork (the confirmations, a candidate's own import)
            r = launcher.run(Run(tuple(argv), python, cwd=work, timeout=timeout,
                                 env=dict(self.cfg.control_env) if control else {},
                                 signature=signature, log_stem=log_stem, own=not fresh,
                                 check_replicas=self.cfg.check_replicas, sandbox=self.cfg.sandbox))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        output = "".join(Path(p).read_text(errors="replace")
                         for p in (r.stdout_path, r.stderr_path) if p and Path(p).exists())
        if r.code >= contract.FAIL and r.returncode is None:  # the runner itself failed, not the candidate
            raise HarnessFailure(f"run {stem}: {r.reason or f'exit {r.code}'}")
        return r, output

    def populate(self, work: Path, files: dict[str, str | None]) -> None:
        """``work`` made: links to what sits beside the script, and the candidate's files."""
        work.mkdir(parents=True)
        for entry in self.cfg.script.parent.iterdir():
            if entry.name in self.original or entry.name == "__pycache__" \
                    or self.cfg.out.is_relative_to(entry.absolute()):
                continue
            if entry.is_dir():  # a real folder of links: what a candidate writes stays in its own
                shutil.copytree(entry, work / entry.name, symlinks=True, copy_function=os.symlink,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (work / entry.name).symlink_to(entry.absolute())
        for name, source in files.items():
            if source is not None:
                (work / name).write_text(source)

    def judge(self, r: harness.RunResult, output: str, work_root: str) -> tuple[bool, str, bool]:
        """Interesting? why (the verdict's reason), and is that final (else not cached: a
        timeout or a kill may go the other way next time)."""
        if r.code != contract.BAD:
            # an exit of its own (another error included) comes again; a timeout or kill may not
            own_exit = r.returncode is not None and r.returncode >= 0
            return False, f"{r.verdict}: {r.reason or 'clean'}", own_exit
        if self.site is not None:
            here = crash_site(output, self.cfg.signature, (work_root, str(self.cfg.script.parent)))
            if here != self.site:
                return False, f"the signature raised elsewhere: {here or 'not as an exception'}", True
        elif self.cfg.signature and not re.search(self.cfg.signature, outside_source_lines(output)):
            return False, "the signature only in a traceback's quoted source line", True
        return True, r.reason or "bad", True

    def run_trials(self, files: dict[str, str | None], trials: int, fresh: bool = False,
                   stop_at_bad: bool = True) -> list[tuple[bool, str, bool]]:
        answers = []
        for _ in range(trials):
            stem = f"{self.key(files)[:12]}-{self.stats.tests}"
            r, output = self.launch(files, stem, fresh)
            self.stats.tests += 1
            answers.append(self.judge(r, output, str(self.cfg.out / "work" / stem)))
            if answers[-1][0] and stop_at_bad:
                break
        return answers

    def on_control(self, files: dict[str, str | None], fresh: bool = False) -> tuple[bool, str, bool]:
        """One run on the control: good there? why not, and is that final (as ``judge`` says)."""
        stem = f"control-{self.key(files)[:12]}-{self.stats.tests}"
        r, _ = self.launch(files, stem, fresh or self.cfg.fresh_process, control=True)
        self.stats.tests += 1
        own_exit = r.returncode is not None and r.returncode >= 0
        return r.code == contract.GOOD, f"{r.verdict}: {r.reason or 'clean'}", own_exit

    def record_values(self, files: dict[str, str | None]) -> dict[str, dict[int, str]]:
        """One launch of ``files`` with their config reads recorded (``passes.values``): per
        file, the reads that gave one plain value every time (by site id). Kept in
        ``values.json`` by the files' key: a resumed reduction does not launch it again."""
        key = f"{self.key(files)}|{VALUE_SITES}"
        path = self.cfg.out / "values.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        if key in known:
            return {n: {int(i): t for i, t in r.items()} for n, r in known[key].items()}
        sinks = {n: self.cfg.out / "work" / f"values-{n}.jsonl" for n, s in files.items() if s}
        for sink in sinks.values():
            sink.parent.mkdir(parents=True, exist_ok=True)
            sink.unlink(missing_ok=True)
        self.check_budget()
        instrumented = {n: instrument(s, sinks[n]) if s else None for n, s in files.items()}
        try:
            r, _ = self.launch(instrumented, f"values-{key[:12]}", fresh=self.cfg.fresh_process)
            self.stats.tests += 1
            records = {n: read_records(sink) for n, sink in sinks.items()}
        finally:
            for sink in sinks.values():
                sink.unlink(missing_ok=True)
        if r.returncode is not None and r.returncode >= 0:  # ran to its own end: it comes again
            results.write_json(path, {**known, key: {n: {str(i): t for i, t in rec.items()}
                                                     for n, rec in records.items()}})
        return records

    def check_budget(self) -> None:
        """Before a launch: the time budget or --max-runs used up ends the reduction."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetSpent()
        if self.run_limit is not None and self.stats.tests >= self.run_limit:
            raise BudgetSpent()

    # the original
    def check_original(self) -> None:
        """Bad to begin with (else BadInput), the crash site, and the trials with 'auto'."""
        runs = AUTO_RUNS if self.cfg.trials == "auto" else self.trials
        self.log(f"[minimize] running the original {runs} time(s) on {self.cfg.where}")
        key = f"{self.key(self.original)}|original"
        cached = self.state.get(key)
        if cached:
            codes, site, slowest = cached["codes"], cached.get("site"), cached["seconds"]
        else:
            codes, site, slowest = [], None, 0.0
            for i in range(runs):
                stem = f"original-{i}"
                r, output = self.launch(self.original, stem, self.cfg.fresh_process)
                self.stats.tests += 1
                codes.append(r.code)
                slowest = max(slowest, r.seconds)
                self.log(f"  run {i + 1}/{runs}: {r.verdict}{f' - {r.reason}' if r.reason else ''}")
                if r.code == contract.BAD and site is None:
                    site = crash_site(output, self.cfg.signature,
                                      (str(self.cfg.out / "work" / stem), str(self.cfg.script.parent)))
            if contract.BAD in codes:
                self.state.put(key, {"verdict": "bad", "codes": codes, "seconds": slowest,
                                     "reason": None, "site": site})
        bad = codes.count(contract.BAD)
        if not bad:
            raise BadInput(f"{self.cfg.script.name} is not bad on {self.cfg.where}: the signature "
                           f"was not seen in {runs} run(s) (logs: {self.cfg.out / 'runs'})")
        self.site = tuple(site) if site else None
        if self.control:
            key = f"{self.key(self.original)}|control"
            if not self.state.get(key):
                good, why, _ = self.on_control(self.original)
                if not good:
                    raise BadInput(f"{self.cfg.script.name} is not good on the control "
                                   f"({self.cfg.control_where}): {why}; the control must be where "
                                   f"the bug is fixed (logs: {self.cfg.out / 'runs'})")
                self.state.put(key, {"verdict": "good", "codes": [contract.GOOD], "seconds": 0.0,
                                     "reason": "the original on the control"})
            self.log(f"[minimize] good on the control ({self.cfg.control_where}): a candidate must be "
                     "bad here and good there")
        # the original is the first best: known interesting (also for a run that ends at once)
        if not self.state.get(self.key(self.original)):
            self.state.put(self.key(self.original), {"verdict": "bad", "codes": [1], "seconds": slowest,
                                                     "reason": "the original"})
        if not (self.cfg.out / "best.json").exists():
            save_best(self.cfg.out, self.original)
        self.timeout = min(self.cfg.timeout, max(CANDIDATE_TIMEOUT[1], CANDIDATE_TIMEOUT[0] * slowest))
        self.slowest, self.slow = slowest, max(SLOWER[0] * slowest, slowest + SLOWER[1])
        self.rate = bad / runs
        if self.cfg.trials == "auto":
            self.trials = trials_for(self.rate)
        self.log(f"[minimize] bad in {bad}/{runs} runs; {self.trials} run(s) per candidate, each "
                 f"limited to {self.timeout:.0f} s"
                 + (f"; signature raised at {' '.join(self.site)}" if self.site else ""))

    # the reducer's test
    def __call__(self, files: dict[str, str | None]) -> bool:
        self.check_budget()
        files = {n: files.get(n) for n in self.original}  # a removed file is None
        why = static_rejection(files, self.cfg.script.name, self.kept, self.known)
        if not why and self.coarse and not only_removes_statements(files, self.best):
            why = "changes inside a statement: left to the fine pass"
        if why:
            self.stats.static += 1
            if self.stats.static % 1000 == 0:  # alive: thousands may be checked between launches
                self.progress(files, False, f"{self.stats.static} candidates checked without a launch")
            return self._count(False, f"not run ({re.sub(r' [(].*', '', why.split(':')[0])})")
        key = self.key(files)
        cached = self.state.get(key)
        if cached:
            self.stats.cache_hits += 1
            interesting = cached["verdict"] == "bad"
            if interesting:
                self.improve(files)
            return interesting
        start = time.monotonic()
        answers = self.run_trials(files, self.trials, fresh=self.cfg.fresh_process)
        interesting = any(ok for ok, *_ in answers)
        reason = next((why for ok, why, _ in answers if ok == interesting), "")
        each = (time.monotonic() - start) / max(1, len(answers))
        slower = interesting and self.slow is not None and each > self.slow
        if slower:  # not cached: a busy machine may have made it so
            interesting, reason = False, (f"slower: bad, but in {each:.0f} s, where the original took "
                                          f"{self.slowest:.0f} s")
        if interesting and self.control:
            good, why, final = self.on_control(files)
            if not good:
                interesting, reason = False, f"not good on the control: {why}"
                answers.append((False, reason, final))
        if (interesting or all(final for *_, final in answers)) and not slower:
            self.state.put(key, {"verdict": "bad" if interesting else "skip",
                                 "codes": [1 if ok else 0 for ok, *_ in answers],
                                 "seconds": round(time.monotonic() - start, 1), "reason": reason})
        if interesting:
            self.improve(files)
        return self._count(interesting, reason, files)

    def recheck(self, files: dict[str, str | None]) -> bool:
        """Run a candidate that should be interesting (the original without its comments) again,
        cache aside, as often as needed to see a bug of the measured rate with probability
        0.999; cache it as interesting when it is."""
        runs = trials_for(self.rate, miss=0.001)
        answers = self.run_trials(files, runs)
        if any(ok for ok, *_ in answers):
            self.state.put(self.key(files), {"verdict": "bad", "codes": [1], "seconds": 0.0,
                                             "reason": "seen again"})
            self.improve(files)
            return True
        return False

    def _count(self, interesting: bool, reason: str, files=None) -> bool:
        if not interesting:
            error = re.search(r"\b([A-Z]\w*(?:Error|Exception))\b", reason)
            kind = reason.split(":")[0] + (f" ({error[1]})" if error else "")
            self.stats.outcomes[kind] = self.stats.outcomes.get(kind, 0) + 1
        if files is not None:
            self.progress(files, interesting, reason)
        return interesting

    def improve(self, files: dict[str, str | None]) -> None:
        """The reducer goes on from each interesting candidate: that is the best so far."""
        shown = shown_size(files)  # counted as the report counts them: formatted
        if shown[1] < self.best_size[1]:
            self.shrinks += 1  # not a known candidate accepted again
        self.best, self.best_size = dict(files), shown
        self.stats.improvements += 1
        save_best(self.cfg.out, files)

    @functools.cached_property
    def original_size(self) -> tuple[int, int]:
        return shown_size(self.original)  # formatted, as the best is counted

    def progress(self, files, interesting: bool, reason: str) -> None:
        elapsed = time.monotonic() - self.started
        left = ("" if self.deadline is None else
                f", budget left {clock(max(0.0, self.deadline - time.monotonic()))}")
        lines, tokens = self.best_size
        o_lines, o_tokens = self.original_size
        self.log(f"[minimize] test {self.stats.tests} ({self.stats.cache_hits} cached, "
                 f"{self.stats.static} not run) {clock(elapsed)}{left} | best {lines} lines, "
                 f"{tokens} tokens (of {o_lines}, {o_tokens}) | candidate {shown_size(files)[0]} lines: "
                 f"{'interesting' if interesting else 'not interesting'}"
                 f"{'' if interesting else f' ({reason[:120]})'}")

    def close(self) -> None:
        self.launcher.close()
        if self.control:
            self.control.close()


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def save_best(out: Path, files: dict[str, str | None]) -> None:
    """The best candidate: ``best.json`` (written atomically in one piece: what a resume reads),
    and its files in ``best/`` to look at. Ctrl-C and SIGTERM wait until both are written: the
    interrupt's message says the best so far is in ``best/``."""
    with contract.signals_held():
        results.write_json(out / "best.json", files)
        write_files(out / "best", files)


def load_best(out: Path, original: dict[str, str]) -> dict[str, str | None]:
    """The best candidate of an earlier run, or the original when there is none."""
    try:
        saved = json.loads((out / "best.json").read_text())
    except (OSError, ValueError):
        return dict(original)
    if not isinstance(saved, dict) or set(saved) != set(original):
        return dict(original)
    return saved


def write_files(folder: Path, files: dict[str, str | None]) -> None:
    """The candidate's files in ``folder``, each written atomically; removed files deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        if source is None:
            (folder / name).unlink(missing_ok=True)
        else:
            results.write_atomic(folder / name, source)
