"""`cosyserve batch` and `cosyserve dub` against a server: submit, follow the progress, download.

The submitted batch's id is kept beside the results (`<out>/.cosyserve-batch.json`,
`<track>.cosyserve-dub.json`), so `--resume` after an interruption follows the same batch on the server
instead of submitting it again; the server goes on with it meanwhile (and after its own restarts).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

import httpx

from cosyserve.commands.batch_files import progress_bar, read_input, read_prompt, report_path, write_atomic
from cosyserve.commands.synthesize import threshold_arguments
from cosyserve.errors import ERROR_TABLE, CosyServeError, InputError, Unavailable
from cosyserve.exit_codes import ExitCode

POLL_S = 1.0
TERMINAL = ("done", "failed", "cancelled")


class ServerError(CosyServeError):
    """The server refused or failed a request (its error envelope says why)."""


class ServerUnreachable(ServerError, Unavailable):
    """No answer from --server (refused, unresolvable, timed out): start it or fix the address."""


def remote_batch(args: argparse.Namespace) -> int:
    out = Path(args.out)
    made_out = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    state = out / ".cosyserve-batch.json"
    with _client(args) as client:
        try:
            batch_id = _resumed(state, args) or _submit(
                client, "/v1/batches", args, args.file, {"format": args.format}, state
            )
        except BaseException:
            if made_out and not any(out.iterdir()):  # refused: no empty folder left behind
                out.rmdir()
            raise
        batch = _follow(client, f"/v1/batches/{batch_id}", "item", args.quiet)
        if batch["done"]:
            archive = _get(client, f"/v1/batches/{batch_id}/archive").content
            with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
                for name in zipped.namelist():
                    target = out / name
                    if name == "manifest.csv" or not (args.resume and target.exists()):
                        write_atomic(target, zipped.read(name))
    return _ended(batch, f"{out}/")


def remote_dub(args: argparse.Namespace, track_format: str) -> int:
    out = Path(args.out)
    state = out.with_name(out.name + ".cosyserve-dub.json")
    fields = {"format": track_format, "max_speed": args.max_speed}
    with _client(args) as client:
        dub_id = _resumed(state, args) or _submit(client, "/v1/dub", args, args.subtitles, fields, state)
        dub = _follow(client, f"/v1/dub/{dub_id}", "cue", args.quiet)
        if dub["state"] == "done":
            _download(client, f"/v1/dub/{dub_id}/track", {"format": track_format}, out)
            report = report_path(out, args.report)
            kind = "json" if report.suffix.lower() == ".json" else "csv"
            text = _get(client, f"/v1/dub/{dub_id}/report", {"format": kind}).text
            write_atomic(report, text.encode("utf-8"))
    return _ended(dub, str(out))


def _download(client: httpx.Client, path: str, params: dict[str, Any], target: Path) -> None:
    """A download written to a temp file beside `target` as it arrives (a track can be hours long), then
    moved over `target` once whole."""
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with client.stream("GET", path, params=params) as response:
            if response.status_code >= 400:
                response.read()
                _checked(response)
            with temp.open("wb") as sink:
                for piece in response.iter_bytes(1 << 20):
                    sink.write(piece)
        os.replace(temp, target)
    except httpx.HTTPError as exc:
        raise _unreachable(exc) from None
    finally:
        temp.unlink(missing_ok=True)


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(
        base_url=args.server.rstrip("/"), headers=headers, timeout=120.0, follow_redirects=True
    )


def _resumed(state: Path, args: argparse.Namespace) -> str | None:
    if not state.exists():
        return None
    saved = json.loads(state.read_text(encoding="utf-8"))
    if not args.resume:
        raise InputError(
            f"{state} says batch {saved['id']} was submitted here before: pass --resume to follow it"
        )
    if saved.get("server") != args.server.rstrip("/"):
        raise InputError(f"{state} belongs to a batch on {saved.get('server')}, not {args.server}")
    return str(saved["id"])


def _submit(
    client: httpx.Client, path: str, args: argparse.Namespace, file: str, extra: dict[str, Any], state: Path
) -> str:
    thresholds = threshold_arguments(args)
    fields = {
        key: str(value)
        for key, value in {
            "voice": args.voice,
            "instruct": args.instruct,
            "seed": args.seed,
            "speed": args.speed,
            "volume": args.volume,
            "takes": args.takes,
            "thresholds": json.dumps(thresholds) if thresholds else None,
            "prompt_text": args.prompt_text,
            **extra,
        }.items()
        if value is not None
    }
    files: dict[str, Any] = {"file": (Path(file).name, read_input(file))}
    prompt = read_prompt(args)
    if prompt is not None:
        files["prompt_wav"] = (Path(args.prompt_wav).name, prompt, "audio/wav")
    response = _checked(_send(lambda: client.post(path, data=fields, files=files)))
    batch_id = response.json()["id"]
    state.write_text(json.dumps({"server": args.server.rstrip("/"), "id": batch_id}), encoding="utf-8")
    return str(batch_id)


def _follow(client: httpx.Client, path: str, unit: str, quiet: bool) -> dict[str, Any]:
    """Poll until the batch ends, with a progress bar of its finished items."""
    batch = _get(client, path, {"limit": 0}).json()
    bar = progress_bar(batch["total"], unit, quiet)
    try:
        while True:
            bar.n = batch["done"] + batch["failed"] + batch["cancelled"]
            left = batch.get("estimated_time_left_s")
            bar.set_postfix_str(f"{batch['state']}" + (f", ~{left:.0f} s left" if left else ""))
            if batch["state"] in TERMINAL:
                break
            time.sleep(POLL_S)
            batch = _get(client, path, {"limit": 0}).json()
    except KeyboardInterrupt:
        print(f"\nthe batch goes on on the server: follow it again with --resume ({path})", file=sys.stderr)
        raise
    finally:
        bar.close()
    return _get(client, path, {"limit": 1000}).json()


def _ended(batch: dict[str, Any], where: str) -> int:
    failed = [item for item in batch["items"] if item["state"] != "done"]
    if batch["state"] != "done" or failed:
        reason = (batch.get("error") or {}).get("message") or (failed[0]["error"] or {}).get("message")
        print(
            f"cosyserve: {batch['kind']} {batch['id']} {batch['state']}: {batch['done']} of "
            f"{batch['total']} made in {where}" + (f"; {reason}" if reason else ""),
            file=sys.stderr,
        )
        return ExitCode.FAILED
    print(f"wrote {batch['done']} {'cues' if batch['kind'] == 'dub' else 'items'} to {where}")
    return 0


def _get(client: httpx.Client, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
    return _checked(_send(lambda: client.get(path, params=params)))


def _send(call: Any) -> httpx.Response:
    try:
        return call()
    except httpx.HTTPError as exc:
        raise _unreachable(exc) from None


def _unreachable(exc: httpx.HTTPError) -> ServerError:
    return ServerUnreachable(f"the server could not be reached ({type(exc).__name__}: {exc}): check --server")


class ServerRefusedInput(ServerError, InputError):
    """The server refused what was sent (the text, a file, a voice, a limit): the exit status a local run
    gives the same input (2), not a failure's (1)."""


# The error codes a local run meets as input errors (`ERROR_TABLE`), and the API's schema refusals.
_INPUT_CODES = frozenset(
    {kind.code for _, kind in ERROR_TABLE if kind.exit == ExitCode.USAGE} | {"invalid_request"}
) - {"settings"}


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code < 400:
        return response
    code = None
    try:
        error = response.json()["error"]
        message, code = error["message"], error.get("code")
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    said = f"the server answered {response.status_code}: {message}"
    if response.status_code < 500 and code in _INPUT_CODES:
        raise ServerRefusedInput(said)
    raise ServerError(said)
