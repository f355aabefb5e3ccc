"""`cosyserve backup`: a copy of a running single server's data that a server starts from, whole."""

from __future__ import annotations

import sqlite3
import threading

from tests.conftest import API_TEXT, enrol_voice

from cosyserve.cli import main as cli_main


def test_a_backup_taken_while_two_users_work_restores_whole(start_api_server, prompt_wav_bytes, tmp_path):
    """A `tar` of a busy server's data directory gave a malformed database (the WAL file and the database
    copied moments apart); the backup's database is one snapshot, checked, and a server started on the
    copy has every key, voice and output, each still its owner's alone."""
    server = start_api_server(api_keys_required=True, rate_limit_per_minute=0)
    keys = server.service.keys
    secrets = {name: keys.create(name, "user")[1] for name in ("alice", "bob")}
    data_dir = server.service.settings.storage.data_dir
    made: dict[str, list[str]] = {"alice": [], "bob": []}
    stop = threading.Event()

    def work(name: str) -> None:
        with server.client(headers={"Authorization": f"Bearer {secrets[name]}"}) as client:
            enrol_voice(client, f"{name}-voice", prompt_wav_bytes)
            while not stop.is_set():
                spoken = client.post("/v1/tts", json={"text": API_TEXT, "voice": f"{name}-voice"})
                made[name].append(spoken.headers["x-cosyserve-output-id"])

    workers = [threading.Thread(target=work, args=(name,)) for name in made]
    for worker in workers:
        worker.start()
    try:
        while min(len(ids) for ids in made.values()) < 2:
            stop.wait(0.1)
        dest = tmp_path / "backup"
        assert cli_main(["backup", str(dest), "--outputs", "--data-dir", str(data_dir)]) == 0
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
        server.stop()
    with sqlite3.connect(dest / "cosyserve.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert not (dest / "server.lock").exists()  # (this server's signing secret is a setting, not a file)
    restored = start_api_server(data_dir=dest, api_keys_required=True)
    try:
        for name, other in (("alice", "bob"), ("bob", "alice")):
            with restored.client(headers={"Authorization": f"Bearer {secrets[name]}"}) as client:
                voices = [v["name"] for v in client.get("/v1/voices").json()["data"]]
                assert voices == [f"{name}-voice"]
                listed = {o["id"] for o in client.get("/v1/outputs", params={"limit": 1000}).json()["data"]}
                assert made[name][0] in listed and not listed & set(made[other])
                assert client.get(f"/v1/outputs/{made[name][0]}").status_code == 200
                spoken = client.post("/v1/tts", json={"text": API_TEXT, "voice": f"{name}-voice"})
                assert spoken.status_code == 200  # its voice's files written again from the database
    finally:
        restored.stop()


def test_backup_refuses_what_it_cannot_do(tmp_path, capsys) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert cli_main(["backup", str(tmp_path / "full"), "--data-dir", str(tmp_path)]) != 0
    assert "not an empty folder" in capsys.readouterr().err
    assert cli_main(["backup", str(tmp_path / "b"), "--data-dir", str(tmp_path / "nowhere")]) != 0
    assert "no cosyserve data at" in capsys.readouterr().err
    url = "postgresql+psycopg://u:p@localhost/db"
    assert cli_main(["backup", str(tmp_path / "c"), "--data-dir", str(tmp_path), "--database-url", url]) != 0
    assert "pg_dump" in capsys.readouterr().err


def test_a_damaged_database_makes_the_server_unready(start_api_server, tmp_path) -> None:
    """A server started on a malformed database (a copy taken mid-write, a failing disk) said ready and
    answered what touched the damage with 500s: its start checks the database and says what to do."""
    import os
    import time

    first = start_api_server(data_dir=tmp_path / "data")
    first.stop()
    path = tmp_path / "data" / "cosyserve.db"
    db = sqlite3.connect(path)  # a table of its own at the file's end: the damage spares what a start reads
    with db:
        db.execute("CREATE TABLE filler (x TEXT)")
        db.executemany("INSERT INTO filler VALUES (?)", [(str(i) * 50,) for i in range(3000)])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(size - 3 * 4096 + 64)
        handle.write(os.urandom(3000))
    server = start_api_server(data_dir=tmp_path / "data", wait_ready=False)
    try:
        deadline = time.monotonic() + 60
        while server.service.database_problem is None:
            assert time.monotonic() < deadline, "the damage was not found"
            time.sleep(0.05)
        with server.client() as client:
            while server.service.model_state != "ready":
                time.sleep(0.05)
            ready = client.get("/ready")
        assert ready.status_code == 503
        assert "the database is damaged" in ready.json()["error"]["message"]
        assert "restore the last backup" in ready.json()["error"]["message"]
    finally:
        server.stop()


def test_keys_and_voices_commands_make_private_files_too(tmp_path) -> None:
    """Only serve and worker narrowed the mask: a first `keys create` made the data folder 0755 and
    `voices add` wrote the recording 0644."""
    data = tmp_path / "fresh"
    assert cli_main(["keys", "create", "ops", "--role", "admin", "--quiet", "--data-dir", str(data)]) == 0
    made = [data, *data.rglob("*")]
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in made if p.stat().st_mode & 0o077} == {}


def test_backup_copies_the_secrets_finished_outputs_and_kept_pieces_only(tmp_path, capsys) -> None:
    data = tmp_path / "data"
    (data / "c2pa").mkdir(parents=True)
    (data / "c2pa" / "key.pem").write_text("k")
    (data / "signing_secret").write_text("s" * 44)
    (data / "server.lock").write_text("pid 1")
    with sqlite3.connect(data / "cosyserve.db") as db:
        db.execute("CREATE TABLE t (x)")
    outputs = data / "outputs"
    outputs.mkdir()
    for name in ("output_20261207_120000.wav", "output_20261207_120000.json", ".output_1.tmp", "server.lock"):
        (outputs / name).write_text(name)
    (outputs / ".job-pieces" / "job1").mkdir(parents=True)  # a running long text's finished pieces
    (outputs / ".job-pieces" / "job1" / "0.npy").write_text("0")
    assert cli_main(["backup", str(tmp_path / "b"), "--outputs", "--data-dir", str(data)]) == 0
    copied = sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert copied == [
        "c2pa/key.pem",
        "cosyserve.db",
        "outputs/.job-pieces/job1/0.npy",  # (a restored running job goes on from them)
        "outputs/output_20261207_120000.json",
        "outputs/output_20261207_120000.wav",
        "signing_secret",
    ]
    assert "outputs: 2 files" in capsys.readouterr().out
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "cosyserve.db").write_bytes(b"")
    argv = ["backup", str(tmp_path / "d"), "--outputs", "--data-dir", str(tmp_path / "bare")]
    assert cli_main(argv) != 0 and "no output folder" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # refused before anything was written: a retry may use it
