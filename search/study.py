"""The Optuna study of one problem: storage, naming, and reading back what was already measured."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import time
import uuid
from pathlib import Path

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import FAMILIES, LAUNCH_RULES, Variant, direction_key, make_config, tune_axes
from search.samplers import make_sampler

DEFAULT_RUNS_DIR = Path("runs")
# Studies are per problem and per version of the axes and launch rules: a changed space starts a new study.
SPACE_TAG = hashlib.sha256(json.dumps({"axes": {f"{d}_{lay}_{f.name}": {k: list(v) for k, v in f.axes.items()}
                                                for (d, lay), fams in FAMILIES.items() for f in fams},
                                       "launch_rules": LAUNCH_RULES}).encode()).hexdigest()[:8]


def distributions(p: Problem, direction: str = "fwd") -> dict:
    """Optuna's view of the parameters of a tune of the problem in a direction (space.tune_axes)."""
    return {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in tune_axes(p, direction).items()}

RESULT_ATTR = "result"
SKIP_ATTR = "skipped"
OWNER_ATTR = "owner"
SWEPT_ATTR = "swept"
DIGEST_ATTR = "digest"  # the variant a trial claimed to measure (set before OWNER_ATTR)
WORKER_ATTR = "worker"  # which tuner measured it (tune.py --workers: the host and the GPU)
EXTRA_ATTR = "extra"  # a variant passed in beside the sampler's (tests' faults); its trial has no params
# A study's user attr: whose variants it measures, fwd or bwd (not Optuna's "minimize"). Studies stored
# before it was set are forward ones.
DIRECTION_ATTR = "kernel_direction"
# A RUNNING trial with no owner yet is one a tuner has just asked (it claims it right after): only this
# old is it taken for one left behind.
UNCLAIMED_GRACE_S = 60.0

optuna.logging.set_verbosity(optuna.logging.WARNING)


def default_storage(runs_dir: Path = DEFAULT_RUNS_DIR) -> str:
    """An SQLite file under runs/: embedded, nothing to start, and the same command resumes it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{runs_dir / 'dwgen.db'}"


class StorageError(RuntimeError):
    """A storage URL that could not be opened: no such database, no driver for it, not an Optuna database."""


JOURNAL_PREFIX = "journal:///"
# How long a writer waits for another process's lock on an SQLite study (tune.py --workers on one host)
# before giving up; SQLite's own default of 5 s is short for several tuners telling results at once.
SQLITE_BUSY_TIMEOUT_S = 60


def journal_path(url: str) -> str | None:
    """The file of a journal:///FILE storage (relative, or absolute as journal:////abs/file); None otherwise."""
    return url[len(JOURNAL_PREFIX):] if url.startswith(JOURNAL_PREFIX) else None


def _with_driver(url: str) -> str:
    """postgresql://... through psycopg 3 (requirements.txt's driver) whatever SQLAlchemy's default for the
    scheme (psycopg2 before SQLAlchemy 2.1); a URL that names its driver keeps it."""
    if url.startswith("postgresql://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is not None:
            return "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open an Optuna storage once, so that a bad URL is one line before any search and not a traceback.

    An SQLAlchemy URL opens an RDB storage (SQLite, PostgreSQL, MySQL); journal:///FILE opens Optuna's
    journal file, which tuners on several hosts share through a shared file system."""
    from sqlalchemy.exc import SQLAlchemyError

    path = journal_path(url)
    try:
        if path is not None:
            from optuna.storages.journal import JournalFileBackend

            if not path or not Path(path).parent.is_dir():
                raise OSError(f"no folder for the journal file {path!r}")
            # Optuna's default lock for the file (a symlink made and removed beside it) holds over NFS too.
            return optuna.storages.JournalStorage(JournalFileBackend(path))
        if not url.startswith("sqlite"):
            return optuna.storages.RDBStorage(_with_driver(url))
        # pysqlite's own BEGIN comes only before a write, so a read-then-write transaction (the pop of an
        # enqueued trial: still waiting? then running) is not atomic, and two tuners sharing the file could
        # both pop one trial. Each transaction instead takes the write lock as it begins.
        storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {
            "timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}})
        sqlalchemy.event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        return storage
    except (SQLAlchemyError, ImportError, OSError) as e:  # ImportError: the database's driver is not installed
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"cannot open storage {url}: {first}") from e


def study_name(p: Problem, direction: str = "fwd") -> str:
    """One study per problem, direction and space: the forward's name is the problem's key alone (the name
    of forward studies stored before backward ones existed), the backward's ends in _bwd."""
    return f"dwgen-{SPACE_TAG}-{direction_key(p, direction)}"


def open_study(p: Problem, storage: str | optuna.storages.BaseStorage | None, sampler: str,
               seed: int, direction: str = "fwd") -> optuna.Study:
    """Create or resume the problem's study of a direction (storage None keeps it in memory, for tests)."""
    study = optuna.create_study(study_name=study_name(p, direction), storage=storage,
                                sampler=make_sampler(sampler, seed, p, direction), direction="minimize",
                                load_if_exists=True)
    stored = study.user_attrs.get(DIRECTION_ATTR)
    if stored is None:
        study.set_user_attr(DIRECTION_ATTR, direction)
    elif stored != direction:
        raise ValueError(f"study {study.study_name} measures {stored} variants, not {direction}")
    return study


def study_direction(study: optuna.Study) -> str:
    """fwd or bwd: the variants a study measures."""
    return study.user_attrs.get(DIRECTION_ATTR, "fwd")


def trial_result(t: FrozenTrial) -> Result | None:
    raw = t.user_attrs.get(RESULT_ATTR)
    return Result.from_dict(raw) if raw else None


def measured(study: optuna.Study, p: Problem) -> dict[str, tuple[object, Result]]:
    """Every variant this study already built or evaluated, by digest (skips, duplicates and extras excluded)."""
    direction = study_direction(study)
    out: dict[str, tuple[object, Result]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        r = trial_result(t)
        if (r is not None and not t.user_attrs.get("duplicate") and not t.user_attrs.get(EXTRA_ATTR)
                and r.direction == direction):
            out.setdefault(r.digest, (make_config(p, t.params, direction), r))
    return out


def measured_as_rendered(study: optuna.Study, p: Problem) -> int:
    """How many variants this study measured as the templates render them now: the study's name does not
    change with the templates, and a variant measured before a template change is another kernel."""
    direction = study_direction(study)
    return sum(Variant(p, c, direction).digest == digest for digest, (c, _) in measured(study, p).items())


def asked_params(study: optuna.Study, states=(TrialState.WAITING, TrialState.RUNNING)) -> list[dict]:
    """The params of the trials enqueued and not yet asked (WAITING: fixed params) or asked and not yet told."""
    return [t.params or t.system_attrs.get("fixed_params") for t in study.get_trials(deepcopy=False, states=states)]


def measured_extras(study: optuna.Study) -> dict[str, Result]:
    """The results of the extra variants (those passed in beside the sampler's) this study holds, by digest."""
    out: dict[str, Result] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        r = trial_result(t)
        if r is not None and t.user_attrs.get(EXTRA_ATTR):
            out.setdefault(r.digest, r)
    return out


def record_extra(study: optuna.Study, result: Result, worker: str | None = None) -> None:
    """An extra variant's result as a trial of its own. It has no params and is told no value whatever its
    result, so the samplers learn nothing from a variant that is not in their space (a test's fault)."""
    attrs = {RESULT_ATTR: result.to_dict(), EXTRA_ATTR: True, **({WORKER_ATTR: worker} if worker else {})}
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=attrs))


def record(study: optuna.Study, trial: optuna.Trial, result: Result, duplicate: bool = False) -> None:
    """Store the result on the trial and tell Optuna: a time when correct, a failure otherwise."""
    trial.set_user_attr(RESULT_ATTR, result.to_dict())
    if duplicate:
        trial.set_user_attr("duplicate", True)
    if result.ok:
        study.tell(trial, result.kernel_ms)
    else:
        study.tell(trial, state=TrialState.FAIL)


# A skipped (invalid) combination is told as a very slow one: TPE ignores failed trials and would keep
# proposing the same invalid region (seen on the H200: 2711 of 2801 asks skipped for one problem).
SKIP_PENALTY_MS = 1e6


def record_skip(study: optuna.Study, trial: optuna.Trial, reasons: list[str], penalize: bool = True) -> None:
    """An invalid combination is penalised; a valid one skipped for another reason is only marked failed."""
    trial.set_user_attr(SKIP_ATTR, reasons)
    if penalize:
        study.tell(trial, SKIP_PENALTY_MS)
    else:
        study.tell(trial, state=TrialState.FAIL)


# Owners of searches running in this process: a RUNNING trial owned by this process but by none of these
# was left behind by an earlier search that raised (Ctrl-C, a crash) and is as dead as a killed tuner's.
_LIVE_OWNERS: set[str] = set()


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, so a recycled pid reads differently), "" where
    there is no /proc to ask, None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""


def new_owner() -> str:
    """A token for one search in this process (host, pid, process start, nonce); `release` it at the end."""
    pid = os.getpid()
    token = f"{socket.gethostname()}:{pid}:{_process_start(pid) or ''}:{uuid.uuid4().hex[:8]}"
    _LIVE_OWNERS.add(token)
    return token


def release(owner: str) -> None:
    _LIVE_OWNERS.discard(owner)


def claim(trial: optuna.Trial, owner: str, digest: str | None = None, worker: str | None = None) -> None:
    """Mark a trial as this search's, so that a later search can tell it from one a killed tuner left, and
    as the one that measures `digest` unless a trial before it claimed that variant (see first_claims)."""
    if digest is not None:
        trial.set_user_attr(DIGEST_ATTR, digest)
    if worker is not None:
        trial.set_user_attr(WORKER_ATTR, worker)
    trial.set_user_attr(OWNER_ATTR, owner)


def _claimed(t: FrozenTrial) -> str | None:
    """The variant a trial measures or is measuring; None for skips, duplicates, and trials closed unmeasured."""
    if t.user_attrs.get("duplicate") or t.user_attrs.get(SKIP_ATTR) or t.user_attrs.get(EXTRA_ATTR):
        return None
    if t.state == TrialState.RUNNING:
        return t.user_attrs.get(DIGEST_ATTR)
    r = trial_result(t)
    return r.digest if r is not None else None


CLAIM_POLL_S = 0.05


def first_claims(study: optuna.Study, mine: dict[int, str]) -> dict[int, FrozenTrial | None]:
    """For each of this search's claimed trials (number -> digest), the first trial of the study that claimed
    the same variant, when that is another one; None where this search's trial is the first.

    Tuners on one study (tune.py --workers, several hosts) can be asked the same variant at once. The first
    trial, by number, to claim a variant measures it; any later one is a duplicate of it. That is decided
    only once every trial numbered below is settled (claimed, or told): a claim is written right after the
    ask, so the wait is short, and a trial still unclaimed after UNCLAIMED_GRACE_S was left by a dead tuner."""
    if not mine:
        return {}
    top = max(mine)
    deadline = time.monotonic() + UNCLAIMED_GRACE_S
    while True:
        trials = study.get_trials(deepcopy=False)
        now = datetime.datetime.now()
        unsettled = [t for t in trials if t.number < top and t.number not in mine and t.state == TrialState.RUNNING
                     and OWNER_ATTR not in t.user_attrs and not _left_behind(t, now)]
        if not unsettled or time.monotonic() > deadline:
            break
        time.sleep(CLAIM_POLL_S)
    first: dict[str, FrozenTrial] = {}
    for t in sorted(trials, key=lambda t: t.number):
        d = _claimed(t)
        if d is not None and d not in first:
            first[d] = t
    return {n: (first[d] if d in first and first[d].number < n else None) for n, d in mine.items()}


def _left_behind(t: FrozenTrial, now: datetime.datetime) -> bool:
    """Whether a RUNNING trial's tuner is gone. A trial claimed on another host is never taken: whether
    that tuner lives cannot be told from here."""
    owner = t.user_attrs.get(OWNER_ATTR)
    if owner is None:
        started = t.datetime_start
        return started is None or (now - started).total_seconds() > UNCLAIMED_GRACE_S
    host, pid, started, _ = owner.rsplit(":", 3)
    if host != socket.gethostname():
        return False
    if int(pid) == os.getpid():
        return owner not in _LIVE_OWNERS
    return _process_start(int(pid)) != started


def sweep_stale(study: optuna.Study) -> list[int]:
    """Close the trials a killed tuner left RUNNING; returns their numbers.

    A trial whose result was stored before the kill is told that result (it was measured: not again);
    any other is marked failed, with a user attr saying why, so it is not counted, and its params are
    enqueued so that the next search asks that variant first and measures it once."""
    now = datetime.datetime.now()
    swept, again = [], []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _left_behind(t, now):
            continue
        trial = optuna.Trial(study, t._trial_id)  # the public handle on a trial another process asked
        result = trial_result(t)
        if result is not None:
            record(study, trial, result, duplicate=bool(t.user_attrs.get("duplicate")))
        else:
            trial.set_user_attr(SWEPT_ATTR, "left RUNNING by a tuner that stopped before telling it "
                                            "(killed?); not counted, its variant is asked again")
            study.tell(trial, state=TrialState.FAIL)
            if t.params and SKIP_ATTR not in t.user_attrs:
                again.append(t.params)
        swept.append(t.number)
    waiting = asked_params(study, (TrialState.WAITING,))
    for params in again:
        if params not in waiting:  # a resume killed before it asked them has enqueued them already
            study.enqueue_trial(params)
            waiting.append(params)
    return swept
