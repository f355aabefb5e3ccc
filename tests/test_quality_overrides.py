"""A request's own thresholds (`quality.overrides`): names and ranges checked, merged over the server's,
and the same bounds in the API's schema."""

from __future__ import annotations

import dataclasses

import pytest

from cosyserve.errors import InputError
from cosyserve.service.quality import QualityThresholds
from cosyserve.service.quality.overrides import (
    THRESHOLD_BOUNDS,
    THRESHOLD_NAMES,
    apply_overrides,
    check_overrides,
)


def test_every_threshold_has_bounds_that_hold_its_default() -> None:
    defaults = QualityThresholds()
    assert set(THRESHOLD_BOUNDS) == set(THRESHOLD_NAMES)
    for name in THRESHOLD_NAMES:
        assert THRESHOLD_BOUNDS[name].holds(getattr(defaults, name)), name


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min_loudness": 1.0}, "unknown quality threshold 'min_loudness': use min_similarity, "),
        ({"min_similarity": 1.5}, "min_similarity 1.5 is out of range: use -1 to 1"),
        ({"min_similarity": "high"}, "min_similarity must be a number"),
        ({"max_pace_ratio": 0}, "max_pace_ratio 0 is out of range: use above 0 and at most 100"),
        ({"max_repetition": -0.1}, "max_repetition -0.1 is out of range: use 0 to 1"),
        ({"max_pause_s": float("nan")}, "max_pause_s nan is out of range"),
        ({"max_flatness": True}, "max_flatness must be a number"),
        ([("min_similarity", 0.5)], "thresholds must map names to numbers"),
    ],
)
def test_wrong_names_and_values_are_refused_by_name(values, message) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        check_overrides(values)


def test_overrides_replace_only_what_they_name() -> None:
    server = QualityThresholds(min_similarity=0.4, max_pause_s=1.5)
    merged = apply_overrides(server, {"min_similarity": 0.7, "max_error_rate": 2})
    assert merged == dataclasses.replace(server, min_similarity=0.7, max_error_rate=2.0)
    assert apply_overrides(server, None) is server and apply_overrides(server, {}) is server
    assert apply_overrides(server, {"min_pace_ratio": 2.0}).min_pace_ratio == 2.0  # equal ends: a point
    with pytest.raises(InputError, match=r"min_pace_ratio 2\.5 is above max_pace_ratio 2"):
        apply_overrides(server, {"min_pace_ratio": 2.5})


def test_the_api_schema_uses_the_same_bounds() -> None:
    from pydantic import ValidationError

    from cosyserve.api.schemas import Thresholds, TtsParams

    assert set(Thresholds.model_fields) == set(THRESHOLD_NAMES)
    params = TtsParams.model_validate({"text": "hi", "voice": "a", "thresholds": '{"max_pause_s": 3}'})
    assert params.to_request(None).thresholds == {"max_pause_s": 3.0}  # a form's JSON text
    assert TtsParams.model_validate({"text": "hi", "thresholds": {}}).to_request(None).thresholds is None
    wrongs = ({"max_pace_ratio": 0}, {"min_similarity": -1.01}, {"loudness": 1})
    for wrong in (*wrongs, {"min_pace_ratio": 3, "max_pace_ratio": 2}):
        with pytest.raises(ValidationError):
            TtsParams.model_validate({"text": "hi", "thresholds": wrong})
