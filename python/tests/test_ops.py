"""Every op x dtype x 2, 3 and 4 ranks, against Gloo (or a local
reference where Gloo cannot run the case). One world per size runs every
case; each case is reported on its own."""

import pytest

import ops_cases
import world

SIZES = [2, 3, 4]
_results = {}


def results_for(n):
    if n not in _results:
        _results[n] = world.values(world.run(n, ops_cases.run_all, timeout=300))
    return _results[n]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("case", ops_cases.all_cases())
def test_case(n, case):
    per_rank = results_for(n)
    failures = {r: res[case] for r, res in enumerate(per_rank) if res.get(case, "missing")}
    assert not failures, f"{case} at {n} ranks: {failures}"
