"""lra-sync: each run says whether it reached W&B; a run not synced makes the command fail, whatever wandb's own
exit status; a cut or damaged offline log and a run still training are not uploaded; an unreachable server is
given up after --timeout; a signal stops wandb with it. No network: a stand-in `wandb` on PATH prints what
wandb 0.31's `wandb sync` prints in each case (and exits 0 where it does), or hangs as it does when the server
does not answer."""

from __future__ import annotations

import json
import os
import shlex
import struct
import sys
import zlib
from pathlib import Path

import pytest

from conftest import run_command

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

FAKE_WANDB = '''#!{python}
import json, os, signal, subprocess, sys
from pathlib import Path

with open(os.environ["FAKE_WANDB_CALLS"], "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
folders = [Path(arg) for arg in sys.argv[2:] if "offline-run-" in arg]
logs = [log for folder in folders for log in sorted(folder.glob("*.wandb"))]
mode = next(((f / "FAKE").read_text().strip() for f in folders if (f / "FAKE").exists()), "finish")
print(f"wandb: Syncing {{len(logs)}} run(s):")
for log in logs:
    print(f"wandb:   {{log}}")
run = "lra/" + logs[0].stem.split("-", 1)[1]
if mode == "finish":
    print("wandb: [wandb sync] Loaded credentials for https://api.wandb.ai from WANDB_API_KEY.")
    for log in logs:
        print(f"wandb: [{{run}}] Finished syncing {{log}}")
elif mode == "server-error":
    print(f'wandb: ERROR Failed to sync all data from "{{logs[0]}}": the file ends with an incomplete record. If '
          "the run is still running, retry after it finishes or use `wandb beta sync --live`.")
elif mode == "not-authenticated":
    print("wandb: Not authenticated.")
elif mode == "no-key":
    print("wandb: ERROR Find detailed error logs at: /tmp/debug-cli.root.log")
    print("Error: No API key configured. Use `wandb login` to log in.", file=sys.stderr)
    sys.exit(1)
else:  # "hang", "hang-then-signal": the server does not answer; wandb retries for ever, its service too
    print(f"wandb: [{{run}}] setting up run", flush=True)
    service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(os.environ["FAKE_WANDB_SERVICE"]).write_text(str(service.pid))
    if mode == "hang-then-signal":
        os.kill(os.getppid(), signal.SIGTERM)  # lra-sync is stopped (kill, ctrl-C) while wandb waits
    service.wait()
'''


def framed(payloads) -> bytes:
    """A W&B transaction log holding ``payloads`` as records, framed as wandb writes them (LevelDB's log:
    32 KiB blocks of checksummed chunks; a record longer than a block's room is split into pieces)."""
    data = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for payload in payloads:
        first = True
        while True:
            room = BLOCK - len(data) % BLOCK
            if room < 7:
                data += bytes(room)
                continue
            piece, payload = payload[:room - 7], payload[room - 7:]
            data += chunk((FULL if not payload else FIRST) if first else (LAST if not payload else MIDDLE), piece)
            first = False
            if not payload:
                break
    return bytes(data)


def chunk(kind: int, piece: bytes) -> bytes:
    return struct.pack("<IHB", zlib.crc32(bytes([kind]) + piece), len(piece), kind) + piece


RECORDS = [b"run record", bytes(range(256)) * 300, b"history row", b"exit record"]  # 76,800 bytes: three blocks


def offline_run(run: Path, run_id: str, mode: str = "", when: str = "20261127_101500", log: bytes = None) -> Path:
    """``run``/wandb/offline-run-<when>-<run_id>/run-<run_id>.wandb, the stand-in's behaviour for it in FAKE."""
    folder = run / "wandb" / f"offline-run-{when}-{run_id}"
    folder.mkdir(parents=True)
    (folder / f"run-{run_id}.wandb").write_bytes(framed(RECORDS) if log is None else log)
    if mode:
        (folder / "FAKE").write_text(mode)
    return folder


@pytest.fixture
def fake_wandb(tmp_path):
    """PATH with the stand-in wandb first; ``calls()`` lists the arguments of each call it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "wandb"
    script.write_text(FAKE_WANDB.format(python=sys.executable))
    script.chmod(0o755)
    calls_file, service = tmp_path / "wandb-calls.jsonl", tmp_path / "wandb-service.pid"

    class Fake:
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_WANDB_CALLS": str(calls_file),
               "FAKE_WANDB_SERVICE": str(service)}
        service_pid = service

        @staticmethod
        def calls():
            return [json.loads(line) for line in calls_file.read_text().splitlines()] if calls_file.exists() else []

    return Fake


def lra_sync(args, tmp_path, fake, check=False):
    return run_command(["lra-sync", *map(str, args)], tmp_path, tmp_path / "data", env_extra=fake.env, check=check)


def report(result) -> dict:
    """Each run's line on stdout: run folder → (verdict, the rest)."""
    lines = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(": ")
        if verdict in ("synced", "not synced", "already synced", "would sync", "would not sync"):
            run, _, why = rest.partition(": ")
            lines[run.split(" (")[0]] = (verdict, why)
    return lines


def the_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def marker(folder: Path) -> Path:
    (log,) = folder.glob("*.wandb")
    return log.with_name(log.name + ".synced")


def test_each_run_says_whether_it_reached_wandb_and_one_that_did_not_fails_the_command(tmp_path, fake_wandb):
    """wandb sync exits 0 after its own "ERROR Failed to sync all data", and after "Not authenticated.":
    those runs are not synced, the command exits 1; the same command again uploads only what is left."""
    sweep = tmp_path / "sweep"
    synced = offline_run(sweep / "0", "a0")
    failed = offline_run(sweep / "1", "a1", mode="server-error")
    unconfirmed = offline_run(sweep / "2", "a2", mode="not-authenticated")
    (tmp_path / "link").symlink_to(sweep)
    result = lra_sync([sweep, sweep / "0", tmp_path / "link" / "1"], tmp_path, fake_wandb)  # each run once
    assert result.returncode == 1, result.stderr
    lines = report(result)
    assert lines[str(sweep / "0")] == ("synced", "")
    verdict, why = lines[str(sweep / "1")]
    assert verdict == "not synced" and why.startswith('wandb sync said: wandb: ERROR Failed to sync all data from "')
    verdict, why = lines[str(sweep / "2")]
    assert verdict == "not synced" and why == (f"wandb sync exited 0 without saying it finished {unconfirmed.name}/"
                                               "run-a2.wandb (its last line: wandb: Not authenticated.)")
    assert the_error_line(result).startswith("error: 2 of 3 runs not synced (each listed above with why): nothing "
                                             "was deleted")
    assert [call[-1] for call in fake_wandb.calls()] == [str(synced), str(failed), str(unconfirmed)], \
        "one wandb sync call per run folder"
    assert marker(synced).exists() and not marker(failed).exists() and not marker(unconfirmed).exists()

    for folder in (failed, unconfirmed):  # the server is back, the login fixed
        (folder / "FAKE").unlink()
    again = lra_sync([sweep], tmp_path, fake_wandb)
    assert again.returncode == 0, again.stderr
    assert [verdict for verdict, _ in report(again).values()] == ["already synced", "synced", "synced"]
    assert again.stdout.splitlines()[-1] == "all 3 runs synced"
    assert [call[-1] for call in fake_wandb.calls()[3:]] == [str(failed), str(unconfirmed)], "synced runs skipped"


def test_a_resumed_run_uploads_only_what_its_last_sync_did_not(tmp_path, fake_wandb):
    """A run resumed after its first part was synced: one offline folder per process, the same W&B run."""
    run = tmp_path / "runs" / "0"
    first = offline_run(run, "r0", when="20261127_101500")
    marker(first).write_text("")
    resumed = offline_run(run, "r0", when="20261127_121500")
    result = lra_sync([run], tmp_path, fake_wandb)
    assert result.returncode == 0 and report(result) == {str(run): ("synced", "")}
    assert fake_wandb.calls() == [["sync", str(resumed)]] and marker(resumed).exists()


def test_a_wandb_error_exit_names_wandbs_own_fix(tmp_path, fake_wandb):
    offline_run(tmp_path / "run", "b0", mode="no-key")
    result = lra_sync([tmp_path / "run", "--project", "lra"], tmp_path, fake_wandb)
    assert result.returncode == 1
    verdict, why = report(result)[str(tmp_path / "run")]
    assert verdict == "not synced" and why.endswith("| Error: No API key configured. Use `wandb login` to log in.")
    assert fake_wandb.calls()[0][:3] == ["sync", "--project", "lra"]


def test_a_cut_damaged_or_unreadable_log_a_folder_without_one_and_a_run_still_training_are_not_uploaded(
        tmp_path, fake_wandb):
    from lra.run import RunDirectory

    runs = tmp_path / "runs"
    offline_run(runs / "cut", "c0", log=WHOLE[:40_000])  # killed while W&B wrote a record's second piece
    offline_run(runs / "flipped", "c1", log=FLIPPED)
    (offline_run(runs / "empty", "c2") / "run-c2.wandb").unlink()
    offline_run(runs / "training", "c3")
    fifo = offline_run(runs / "fifo", "c5") / "run-c5.wandb"  # reading it would wait for a writer for ever
    fifo.unlink()
    os.mkfifo(fifo)
    offline_run(runs / "whole", "c4")
    training = RunDirectory(runs / "training")
    training.claim(fresh=False)
    try:
        result = lra_sync([runs], tmp_path, fake_wandb)
    finally:
        training.release()
    assert result.returncode == 1
    lines = report(result)
    assert lines[str(runs / "cut")][1].startswith(
        "wandb/offline-run-20261127_101500-c0/run-c0.wandb ends with an incomplete record (cut at byte 32,768 of "
        "40,000: the run was killed while W&B wrote it, or is still writing); if the run is still going, sync after "
        "it ends; else `wandb sync ")
    assert "run-c1.wandb is damaged at byte 24 (a chunk's checksum does not match its contents)" in \
        lines[str(runs / "flipped")][1]
    assert "holds no run-*.wandb file" in lines[str(runs / "empty")][1]
    assert lines[str(runs / "training")][1].startswith(f"still being trained by process {os.getpid()} on ")
    assert lines[str(runs / "fifo")][1] == ("wandb/offline-run-20261127_101500-c5/run-c5.wandb cannot be read: a "
                                            "named pipe, not a regular file: nothing of it can be uploaded")
    assert lines[str(runs / "whole")] == ("synced", "")
    assert the_error_line(result).startswith("error: 5 of 6 runs not synced")
    assert [call[-1] for call in fake_wandb.calls()] == [str(next((runs / "whole" / "wandb").iterdir()))], \
        "only the whole run reached wandb"


def test_an_unreachable_server_is_given_up_after_the_timeout_with_wandb_and_its_service_stopped(tmp_path, fake_wandb):
    offline_run(tmp_path / "runs" / "0", "d0", mode="hang")
    offline_run(tmp_path / "runs" / "1", "d1")
    result = lra_sync([tmp_path / "runs", "--timeout", "0.5"], tmp_path, fake_wandb)
    assert result.returncode == 1
    assert "each run's wandb sync is given 0.5 s (--timeout)" in result.stdout.splitlines()[0]
    lines = report(result)
    assert lines[str(tmp_path / "runs" / "0")][1] == (
        "wandb sync had not finished after 0.5 s, so it was stopped: the W&B server (https://api.wandb.ai) is "
        "unreachable or slow; check the network and your login (wandb login), or pass a longer --timeout")
    assert lines[str(tmp_path / "runs" / "1")] == ("not synced", "not tried (after the time-out above)")
    assert len(fake_wandb.calls()) == 1 and the_error_line(result).startswith("error: 2 of 2 runs not synced")
    assert _ended(int(fake_wandb.service_pid.read_text())), "wandb's service is stopped with it"


def test_a_signal_to_lra_sync_stops_wandb_and_says_what_was_synced(tmp_path, fake_wandb):
    offline_run(tmp_path / "runs" / "0", "e0")
    offline_run(tmp_path / "runs" / "1", "e1", mode="hang-then-signal")
    result = lra_sync([tmp_path / "runs"], tmp_path, fake_wandb)
    assert result.returncode == 143, result.stderr
    assert report(result) == {str(tmp_path / "runs" / "0"): ("synced", "")}
    assert the_error_line(result) == ("error: interrupted (SIGTERM); each run above says whether it was synced; the "
                                      "same command uploads the rest (runs already synced are skipped)")
    assert _ended(int(fake_wandb.service_pid.read_text()))


def test_dry_run_checks_every_run_and_prints_commands_a_shell_can_run(tmp_path, fake_wandb):
    """A path with spaces is quoted (it was printed bare); nothing is uploaded, wandb need not be installed."""
    sweep = tmp_path / "my sweep"
    folder = offline_run(sweep / "job 0", "f0")
    offline_run(sweep / "job 1", "f1", log=framed(RECORDS)[:100])
    result = run_command(["lra-sync", str(sweep), "--dry-run", "--entity", "me", "--include-synced"], tmp_path,
                         tmp_path / "data", env_extra={**fake_wandb.env, "PATH": "/nonexistent"}, check=False)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines()[1:])
    assert shlex.split(lines["would sync"].split(": ", 1)[1]) == ["wandb", "sync", "--entity", "me", "--include-synced",
                                                                 str(folder)]
    assert lines["would not sync"].startswith(f"{sweep / 'job 1'}: ")
    assert result.returncode == 1 and "1 of 2 runs would not be synced" in the_error_line(result)
    assert fake_wandb.calls() == []


@pytest.mark.parametrize("args, words", [
    (["--projcet", "lra"], "unrecognized arguments: --projcet lra"),
    (["--timeout", "nan"], "argument --timeout: 'nan' is not a number of seconds > 0"),
    (["--timeout", "0"], "argument --timeout: '0' is not a number of seconds > 0"),
    (["--timeout", "1e300"], "argument --timeout: '1e300' is more than a day (86400 s), the longest timeout"),
    # each was passed on, and wandb sync failed run after run
    (["-p", ""], "argument -p/--project: '' is no name (empty, an unset shell variable?"),
    (["--replace-tags", "junk"], "argument --replace-tags: 'junk' is not OLD=NEW pairs"),
    # "" was the current folder; a file was "no such directory"
    ([""], "error: a directory argument is empty (an unset shell variable?)"),
    (["notes.txt"], "notes.txt: a file, not a folder"),
], ids=["misspelled option", "timeout nan", "timeout 0", "timeout past a day", "empty project", "tag renames", "empty folder", "a file"])
def test_a_mistake_on_the_command_line_stops_before_wandb_runs(tmp_path, fake_wandb, args, words):
    offline_run(tmp_path / "run", "g0")
    (tmp_path / "notes.txt").write_text("x")
    result = lra_sync([tmp_path / "run", *args], tmp_path, fake_wandb)
    assert result.returncode == 2 and words in result.stderr and fake_wandb.calls() == []


def test_help_lists_what_goes_to_wandb_sync(tmp_path, fake_wandb):
    from lra.commands.sync import PASSED_ON

    text = lra_sync(["--help"], tmp_path, fake_wandb, check=True).stdout
    passed_on = text.split("passed on to wandb sync:")[1]
    for flags, *_ in PASSED_ON:
        assert flags[-1] in passed_on
    assert "--include-synced" in passed_on and "--timeout SECONDS" in text and "default 60" in text
    assert "at most 86400" in text


WHOLE = framed(RECORDS)  # chunks at 7 (a record), 24 (the long one's first piece), 32,768 (its middle), ...
FLIPPED = bytes(WHOLE[:100]) + bytes([WHOLE[100] ^ 1]) + WHOLE[101:]


@pytest.mark.parametrize("log, found", [
    (WHOLE, None),
    (WHOLE[:5], "is not a W&B transaction log (its header is not :W&B's)"),
    (WHOLE[:7], "holds no record (the run ended before W&B wrote anything)"),
    (WHOLE[:10], "ends with an incomplete record (cut at byte 7 of 10: "),
    (WHOLE[:20], "ends with an incomplete record (cut at byte 7 of 20: "),
    (WHOLE[:BLOCK], "ends with an incomplete record (cut at byte 32,768 of 32,768: "),
    (WHOLE[:BLOCK + 3], "ends with an incomplete record (cut at byte 32,768 of 32,771: "),
    (FLIPPED, "is damaged at byte 24 (a chunk's checksum does not match its contents)"),
    (WHOLE[:24] + chunk(MIDDLE, b"a piece"), "is damaged at byte 24 (a record's pieces out of order)"),
    (WHOLE[:24] + chunk(FIRST, b"a") + chunk(FULL, b"b"), "is damaged at byte 32 (a record's pieces out of order)"),
], ids=["whole, three blocks", "cut in the file header", "header only", "cut in a chunk header", "cut in a payload",
        "cut between a record's pieces", "cut in the next block", "a flipped bit", "a record's first piece missing",
        "a record's last piece missing"])
def test_the_log_check_finds_every_cut_and_damage_in_wandbs_framing(tmp_path, log, found):
    from lra.wandb_log import problem

    path = tmp_path / "run-x.wandb"
    path.write_bytes(log)
    assert problem(path) == found if found is None else problem(path).startswith(found), problem(path)


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_folder_without_offline_runs_is_one_line(tmp_path, fake_wandb):
    (tmp_path / "run" / "wandb" / "latest-run").mkdir(parents=True)  # wandb's link to its last run: not a run
    result = lra_sync([tmp_path / "run"], tmp_path, fake_wandb)
    assert result.returncode == 1
    assert the_error_line(result).startswith("error: no offline W&B runs (wandb/offline-run-*)")


FIRST_LOG = Path("runs/0/wandb/offline-run-20261127_101500-h0/run-h0.wandb")
RESUMED_LOG = Path("runs/0/wandb/offline-run-20261127_111500-h0/run-h0.wandb")  # the same run, resumed: same name


@pytest.mark.parametrize("output, code, found", [
    (f"wandb: [lra/h0] Finished syncing {FIRST_LOG}\nwandb: [lra/h0] Finished syncing /abs/{RESUMED_LOG}", 0, None),
    (f"wandb: [lra/h0] Finished syncing {FIRST_LOG}", 0,
     "wandb sync exited 0 without saying it finished offline-run-20261127_111500-h0/run-h0.wandb (its last line: "),
    ("wandb: \x1b[31mERROR\x1b[0m Failed to sync all data\r\n", 0, "wandb sync said: wandb: ERROR Failed to sync all data"),
    ("", 1, "wandb sync failed with exit status 1 (it printed nothing)"),
    ("Traceback (most recent call last):\nKeyError: 'x'", 1,
     "wandb sync failed with exit status 1 (its last line: KeyError: 'x')"),
], ids=["both files finished", "one file of a resumed run unconfirmed", "a coloured error", "a silent failure",
        "wandb crashed"])
def test_a_sync_counts_only_when_wandb_finished_every_file_and_said_no_error(output, code, found):
    from lra.commands.sync import verdict

    said = verdict([FIRST_LOG, RESUMED_LOG], output, code)
    assert said == found if found is None else said.startswith(found), said
