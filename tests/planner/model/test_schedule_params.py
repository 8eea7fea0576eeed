"""Typed schedule parameters: what each algorithm records, their JSON form, and bad input."""

from __future__ import annotations

import pytest

from planner import (
    InvalidScheduleError,
    Schedule,
    ScheduleParams,
    min_feasible_budget,
    solve,
    store_all_budget,
)
from tests.planner.chain_strategies import toy_chain


def test_each_algorithm_fills_its_own_fields_and_they_survive_json() -> None:
    chain = toy_chain()
    budget = (min_feasible_budget(chain) + store_all_budget(chain)) // 2
    for algorithm, fields in (("rotor", ("slots", "slot_bytes")), ("periodic", ("segments", "segment_size")),
                              ("binomial", ("store_all",)), ("store_all", ())):
        schedule = solve(chain, store_all_budget(chain) if algorithm == "store_all" else budget, algorithm)
        assert isinstance(schedule.params, ScheduleParams)
        assert all(getattr(schedule.params, name) is not None for name in fields), (algorithm, schedule.params)
        again = Schedule.from_json(schedule.to_json())
        assert again.params == schedule.params
        assert set(schedule.to_dict()["params"]) == {k for k, v in vars(schedule.params).items() if v is not None}


def test_a_mapping_is_read_into_typed_fields() -> None:
    params = ScheduleParams.from_dict({"offloaded": [3, 1], "transfer": "default", "slots": 4})
    assert params.offloaded == (3, 1) and params.transfer == "default" and params.slots == 4
    assert params.to_dict() == {"slots": 4, "offloaded": [3, 1], "transfer": "default"}
    assert ScheduleParams.from_dict(None) == ScheduleParams() and ScheduleParams().to_dict() == {}


@pytest.mark.parametrize("raw, says", [
    ({"slotz": 3}, "unknown schedule parameter(s) 'slotz'"),
    ({"slots": -1}, "'slots' must be a whole number >= 0"),
    ({"slots": True}, "'slots' must be a whole number >= 0"),
    ({"offloaded": "1,2"}, "'offloaded' must be a list of whole numbers"),
    ({"offloaded": [1, "2"]}, "'offloaded' must be a list of whole numbers"),
    ({"fallback_from": 3}, "'fallback_from' must be a string"),
    ({"store_all": "yes"}, "'store_all' must be true or false"),
    ([1, 2], "schedule 'params' must be an object"),
])
def test_bad_parameters_are_refused_with_what_was_expected(raw: object, says: str) -> None:
    with pytest.raises(InvalidScheduleError) as caught:
        ScheduleParams.from_dict(raw)  # type: ignore[arg-type]
    assert says in str(caught.value)


def test_a_schedule_file_with_a_foreign_parameter_is_refused() -> None:
    schedule = solve(toy_chain(), 10**12, "rotor")
    data = schedule.to_dict()
    data["params"] = {**data["params"], "mystery": 1}
    with pytest.raises(InvalidScheduleError, match="unknown schedule parameter"):
        Schedule.from_json(data)


def test_the_old_dict_reads_still_work_with_a_deprecation_warning() -> None:
    params = ScheduleParams(offloaded=(2,), slots=5)
    with pytest.warns(DeprecationWarning, match="schedule.params.offloaded"):
        assert params["offloaded"] == [2]
    with pytest.warns(DeprecationWarning):
        assert params.get("segments", 7) == 7
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        params["segments"]
