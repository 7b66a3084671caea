"""search.generic's candidate designs: each one a valid, distinct kernel for every generic (dtype, layout, K)."""
import pytest

from dwgen.dtypes import DTYPES
from dwgen.problem import LAYOUTS
from dwgen.space import GENERIC_KERNEL_SIZES
from search.generic import candidate_variants, candidates


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_candidates_are_valid_and_distinct(dtype, layout):
    for k in GENERIC_KERNEL_SIZES:
        names = [v.name for v in candidate_variants(k, dtype, layout)]
        assert len(names) >= 3, f"{dtype} {layout} K{k}: only {names}"
        assert len(set(names)) == len(names), names


def test_16bit_row_candidates_include_the_register_cap():
    # bf16 K7's tuned winner was the capped design; the generic choice must be able to find it too.
    for dtype in ("bf16", "fp16"):
        assert any(c.cap for c in candidates(dtype, "bcl"))
    assert not any(c.cap for c in candidates("fp32", "bcl"))


def test_a_kept_measurement_is_reused_and_a_changed_candidate_list_is_not(tmp_path, monkeypatch):
    from search import generic

    calls = []

    def fake_choose(k, dtype, layout, build, log=print):
        calls.append((k, dtype, layout))
        return {"kernel": f"k{k}", "config": {}, "geomean_x_copy": 1.0}

    monkeypatch.setattr(generic, "choose", fake_choose)
    first = generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    again = generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    assert first == again and len(calls) == 1
    assert not list(tmp_path.rglob("*.tmp"))
    real = generic.candidates
    monkeypatch.setattr(generic, "candidates", lambda d, lay: real(d, lay)[:-1])
    generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    assert len(calls) == 2  # other candidates: measured anew, not read from the old record
