"""The Optuna study of one problem: storage, naming, and reading back what was already measured."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import FAMILIES, LAUNCH_RULES, family_of, make_config
from search.samplers import make_sampler

DEFAULT_RUNS_DIR = Path("runs")
# Studies are per problem and per version of the axes and launch rules: a changed space starts a new study.
SPACE_TAG = hashlib.sha256(json.dumps({"axes": {f"{d}_{lay}": {k: list(v) for k, v in f.axes.items()}
                                                for (d, lay), f in FAMILIES.items()},
                                       "launch_rules": LAUNCH_RULES}).encode()).hexdigest()[:8]


def distributions(p: Problem) -> dict:
    """Optuna's view of the problem's family axes."""
    return {k: optuna.distributions.CategoricalDistribution(list(v)) for k, v in family_of(p).axes.items()}

RESULT_ATTR = "result"
SKIP_ATTR = "skipped"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def default_storage(runs_dir: Path = DEFAULT_RUNS_DIR) -> str:
    """An SQLite file under runs/: embedded, nothing to start, and the same command resumes it."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{runs_dir / 'dwgen.db'}"


class StorageError(RuntimeError):
    """A storage URL that could not be opened: no such database, no driver for it, not an Optuna database."""


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """Open an Optuna RDB storage once, so that a bad URL is one line before any search and not a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return optuna.storages.RDBStorage(url)
    except (SQLAlchemyError, ImportError) as e:  # ImportError: the database's Python driver is not installed
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"cannot open storage {url}: {first}") from e


def study_name(p: Problem) -> str:
    return f"dwgen-{SPACE_TAG}-{p.key}"


def open_study(p: Problem, storage: str | optuna.storages.BaseStorage | None, sampler: str,
               seed: int) -> optuna.Study:
    """Create or resume the problem's study (storage None keeps it in memory, for tests)."""
    return optuna.create_study(study_name=study_name(p), storage=storage, sampler=make_sampler(sampler, seed, p),
                               direction="minimize", load_if_exists=True)


def trial_result(t: FrozenTrial) -> Result | None:
    raw = t.user_attrs.get(RESULT_ATTR)
    return Result.from_dict(raw) if raw else None


def measured(study: optuna.Study, p: Problem) -> dict[str, tuple[object, Result]]:
    """Every variant this study already built or evaluated, by digest (skips and duplicates excluded)."""
    out: dict[str, tuple[object, Result]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        r = trial_result(t)
        if r is not None and not t.user_attrs.get("duplicate"):
            out.setdefault(r.digest, (make_config(p, t.params), r))
    return out


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
