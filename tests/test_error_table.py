"""The one error table: every reader (API, UI, CLI, cluster, job records) gets the same answer from it."""

from __future__ import annotations

import pytest

from cosyserve.api.errors import classify
from cosyserve.errors import (
    ERROR_TABLE,
    CosyServeError,
    InputError,
    JobStateError,
    ModelDirError,
    QueueFull,
    SyncError,
    VoiceNotFound,
    error_code,
    error_kind,
    exit_code_for,
)
from cosyserve.exit_codes import ExitCode
from cosyserve.service import wire
from cosyserve.ui.i18n import STRINGS


def test_subclasses_come_before_their_bases() -> None:
    classes = [cls for cls, _kind in ERROR_TABLE]
    for position, cls in enumerate(classes):
        for earlier in classes[:position]:
            assert not issubclass(cls, earlier), f"{cls.__name__} is shadowed by {earlier.__name__}"


def test_every_ui_sentence_exists() -> None:
    missing = [kind.ui_key for _cls, kind in ERROR_TABLE if kind.ui_key and kind.ui_key not in STRINGS]
    assert not missing


@pytest.mark.parametrize(
    ("exc", "code", "status", "exit_code"),
    [
        # these codes were different in job records, metrics and the cluster before the tables were one
        (SyncError("bucket down"), "storage_unavailable", 503, ExitCode.FAILED),  # was "sync"
        (JobStateError("ended"), "conflict", 409, ExitCode.FAILED),  # was "job_state"
        (ModelDirError("missing"), "model_unavailable", 503, ExitCode.UNAVAILABLE),  # was "model_dir"
        (VoiceNotFound("no voice"), "voice_not_found", 404, ExitCode.USAGE),  # was "invalid_input"
        (InputError("bad"), "invalid_input", 400, ExitCode.USAGE),
        (QueueFull("full", 3), "queue_full", 429, ExitCode.FAILED),
        (RuntimeError("bug"), "internal", 500, ExitCode.FAILED),
    ],
)
def test_api_cli_records_and_cluster_agree(
    exc: BaseException, code: str, status: int, exit_code: int
) -> None:
    assert classify(exc) == (status, code)
    assert error_code(exc) == code
    assert exit_code_for(exc) == exit_code
    assert wire.encode_error(exc)["code"] == code


def test_an_unlisted_error_of_ours_is_named_after_its_class() -> None:
    class DiskGremlinError(CosyServeError):
        pass

    kind = error_kind(DiskGremlinError("x"))
    assert (kind.code, kind.status, kind.exit) == ("disk_gremlin", 500, ExitCode.FAILED)
