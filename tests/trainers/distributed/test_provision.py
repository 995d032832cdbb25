"""`adaptplan provision` (trainers/distributed/provision.py; docs/mqtt.md "A real deployment"): the broker's folder
and one kit per rank, every file private; the recipe of docs/mqtt.md run verbatim on loopback trains to the
simulator's losses; wrong options end in one line and exit code 2."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptplan.cli import main
from tests.process_runs import losses, simulate
from trainers.distributed.broker import wait_until_listening
from trainers.distributed.launch import free_port

MOSQUITTO = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
HASHER = shutil.which("mosquitto_passwd") or shutil.which("mosquitto_passwd", path="/usr/sbin:/usr/local/sbin")
pytestmark = [pytest.mark.skipif(MOSQUITTO is None or HASHER is None or shutil.which("openssl") is None,
                                 reason="needs mosquitto, mosquitto_passwd and openssl (.ci/run installs mosquitto)"),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a broker on loopback")]
SMALL = ["--algorithm", "sfl-v1", "--cuts", "2", "--dataset", "synthetic", "--model", "mlp", "--seed", "5",
         "--rounds", "3", "--eval-every", "3"]


def provisioned(tmp_path: Path, port: int, *extra: str, name: str = "deploy", train: list[str] = SMALL) -> Path:
    out = tmp_path / name
    assert main(["provision", "--broker", f"127.0.0.1:{port}", "--devices", "3", "--out", str(out), *extra,
                 "--", *train]) == 0
    return out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_is_private_and_each_rank_gets_its_own_kit(tmp_path, capsys) -> None:
    out = provisioned(tmp_path, 18999, "--run", "exp1")
    err = capsys.readouterr().err
    assert "kits/rank0..rank4 (edge server, fed server, device 0, device 1, device 2)" in err
    assert f"cd {out / 'broker'} && mosquitto -c mosquitto.conf" in err
    files = [p for p in out.rglob("*")]
    assert {mode(p) for p in files if p.is_dir()} | {mode(out)} == {0o700}
    assert {mode(p) for p in files if p.is_file() and p.name != "run.sh"} == {0o600}
    assert {mode(p) for p in files if p.name == "run.sh"} == {0o700}
    broker = out / "broker"
    assert sorted(p.name for p in broker.iterdir()) == ["acl", "broker.crt", "broker.key", "ca.crt", "mosquitto.conf",
                                                        "passwd"]
    config = (broker / "mosquitto.conf").read_text()
    for line in ("listener 18999", "allow_anonymous false", "use_username_as_clientid true", "password_file passwd",
                 "acl_file acl", "cafile ca.crt", "keyfile broker.key"):
        assert line in config.splitlines(), line
    owner = pwd.getpwuid(broker.stat().st_uid).pw_name
    expected = "mosquitto" if os.geteuid() == 0 and _has_user("mosquitto") else pwd.getpwuid(os.geteuid()).pw_name
    assert owner == expected and f"user {expected}" in config.splitlines()
    assert "pattern write ap/exp1/to/rank4/from/%u" in (broker / "acl").read_text()
    assert "ap/exp1/to/+/" not in (broker / "acl").read_text()
    from trainers.config.train_config import TrainConfig
    from trainers.distributed.broker import BrokerLimits
    from trainers.distributed.frame_bound import largest_frame

    bound = largest_frame(TrainConfig.flat(devices=3, algorithm="sfl-v1", dataset="synthetic", model="mlp"))
    limits = BrokerLimits.for_run(5, bound.largest)          # issue 67 M4: derived from the run's largest frame
    for line in ("retain_available false", f"max_packet_size {limits.max_packet_bytes}",
                 f"max_queued_messages {limits.queued_messages}", f"max_queued_bytes {limits.queued_bytes}"):
        assert line in config.splitlines(), line
    san = subprocess.run(["openssl", "x509", "-in", str(broker / "broker.crt"), "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in san
    passwords = {}
    for r in range(5):
        kit = out / "kits" / f"rank{r}"
        assert sorted(p.name for p in kit.iterdir()) == sorted(["ca.crt", f"rank{r}.password", "rank.env", "run.secret",
                                                                 "run.sh"])
        passwords[r] = (kit / f"rank{r}.password").read_text().strip()
        env = dict(line.split("=", 1) for line in (kit / "rank.env").read_text().splitlines())
        assert env == {"RANK": str(r), "WORLD_SIZE": "5", "ADAPTPLAN_RUNTIME": "mqtt",
                       "ADAPTPLAN_MQTT_BROKER": "127.0.0.1:18999", "ADAPTPLAN_MQTT_CA": "ca.crt",
                       "ADAPTPLAN_MQTT_PASSWORD_FILE": f"rank{r}.password", "ADAPTPLAN_MQTT_RUN": "exp1",
                       "ADAPTPLAN_SECRET_FILE": "run.secret"}
        assert (kit / "ca.crt").read_bytes() == (broker / "ca.crt").read_bytes()
        assert "-m adaptplan.distributed --devices 3 --algorithm sfl-v1" in (kit / "run.sh").read_text()
    assert len(set(passwords.values())) == 5                                   # one password each
    assert len({(out / "kits" / f"rank{r}" / "run.secret").read_text() for r in range(5)}) == 1   # one secret
    hashed = (broker / "passwd").read_text()
    assert not any(p in hashed for p in passwords.values()) and hashed.count("$7$") == 5   # only hashes on the broker
    assert not any(p.name == "ca.key" for p in files if "ca" not in p.relative_to(out).parts[:1])   # the CA key stays


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.mark.parametrize("argv, field", [
    (["--broker", "no-port", "--devices", "3"], "--broker"),
    (["--broker", "a" * 300 + ":1", "--devices", "3"], "--broker"),          # found by the issue 36 harness: these
    (["--broker", "$(id):1", "--devices", "3"], "--broker"),                 # were openssl's internal errors
    (["--broker", "../../x:1", "--devices", "3"], "--broker"),
    (["--broker", "256.1.1.1:1", "--devices", "3"], "--broker"),
    (["--broker", "host name:1", "--devices", "3"], "--broker"),
    (["--broker", "h:1", "--devices", "3", "--ranks", "100"], "--ranks"),      # 98 device hosts for 3 devices
    (["--broker", "h:1", "--devices", "3", "--ranks", "6"], "6 ranks give 4 device hosts for 3 devices: at most 5"),
    (["--broker", "h:1", "--devices", "3", "--", "--runtime", "mqtt"], "--runtime"),
    (["--broker", "h:1", "--devices", "3", "--", "--ranks", "4"], "--ranks"),
    (["--broker", "h:1", "--devices", "3", "--", "--devices", "4"], "--devices"),
    (["--broker", "h:1", "--devices", "3", "--run", "a/b"], "--run"),
    (["--broker", "::1:18000", "--devices", "3"], "--broker: '::1:18000': an IPv6 address goes in brackets"),
    (["--broker", "h:1", "--devices", "3", "--run", ""], "--run: '' is not a run name"),     # the second harness
    (["--broker", "h:1", "--devices", "3", "--", "--resume"], "--resume: needs --out"),      # run found these taken
    (["--broker", "h:1", "--devices", "3", "--", "--checkpoint-every", "2"], "--checkpoint-every: needs --out"),
    (["--broker", "h:1", "--devices", "3", "--out", ""], "--out: is empty"),    # tools/hostile_provision.py: ''
])                                                                                 # wrote into the working folder
def test_a_wrong_option_is_named_in_one_line_with_exit_code_2(tmp_path, capsys, argv, field) -> None:
    assert main(["provision", "--out", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and field in err and "Traceback" not in err, err
    assert not (tmp_path / "d").exists()


def test_a_training_option_holding_a_line_break_is_one_line(tmp_path, capsys) -> None:
    """tools/hostile_provision.py: argparse's own message echoed the value's line break (two lines)."""
    with pytest.raises(SystemExit) as stop:
        main(["provision", "--out", str(tmp_path / "d"), "--broker", "h:1", "--devices", "3", "--",
              "--data-dir", "x\ntouch y"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == "adaptplan: error: unrecognized arguments: --data-dir x\\ntouch y\n", err
    assert not (tmp_path / "d").exists()


def test_a_file_the_training_options_name_is_copied_into_every_kit_and_a_missing_one_is_named(tmp_path, capsys) -> None:
    """Found by the issue 36 harness: ``-- --system /nope.toml`` was provisioned, to fail on every rank later."""
    (tmp_path / "run.toml").write_text("seed = 5\n")
    out = provisioned(tmp_path, 18998, train=["--config", str(tmp_path / "run.toml"), "--rounds", "2"])
    for r in range(5):
        kit = out / "kits" / f"rank{r}"
        assert (kit / "config.toml").read_bytes() == b"seed = 5\n" and mode(kit / "config.toml") == 0o600
        assert "-m adaptplan.distributed --devices 3 --config config.toml --rounds 2 " in (kit / "run.sh").read_text()
    for flag in ("--system", "--constants=", "--config"):
        missing = str(tmp_path / "nope.toml")
        argv = [f"{flag}{missing}"] if flag.endswith("=") else [flag, missing]
        assert main(["provision", "--broker", "h:1", "--devices", "3", "--out", str(tmp_path / "d"), "--", *argv]) == 2
        assert f"{flag.rstrip('=')}: {missing!r} is not a file here" in capsys.readouterr().err
        assert not (tmp_path / "d").exists()


def test_a_training_option_is_checked_before_anything_is_written_and_a_used_folder_is_refused(tmp_path, capsys) -> None:
    assert main(["provision", "--broker", "h:1", "--devices", "3", "--out", str(tmp_path / "d"), "--", "--rounds", "0"]) == 2
    assert "rounds" in capsys.readouterr().err and not (tmp_path / "d").exists()
    with pytest.raises(SystemExit) as stop:                              # an unknown flag: argparse's one line
        main(["provision", "--broker", "h:1", "--devices", "3", "--out", str(tmp_path / "d"), "--", "--roundz", "3"])
    assert stop.value.code == 2 and "--roundz" in capsys.readouterr().err and not (tmp_path / "d").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    assert main(["provision", "--broker", "h:1", "--devices", "3", "--out", str(tmp_path / "used")]) == 2
    assert "--out" in capsys.readouterr().err


def start_broker(folder: Path, as_user: str | None = None) -> subprocess.Popen:
    """The recipe's ``cd <folder> && mosquitto -c mosquitto.conf`` (under ``as_user`` with runuser); waits until it
    listens."""
    command = [MOSQUITTO, "-c", "mosquitto.conf"]
    if as_user:
        command = ["runuser", "-u", as_user, "--", *command]
    proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = int(next(line.split()[1] for line in (folder / "mosquitto.conf").read_text().splitlines()
                    if line.startswith("listener ")))
    try:
        wait_until_listening(proc, port)
    except RuntimeError:
        proc.kill()
        raise
    return proc


def test_the_recipe_trains_to_the_simulators_losses(tmp_path) -> None:
    """docs/mqtt.md's recipe verbatim on loopback: provision, start the broker from its folder, run each kit's
    run.sh (device kits first, in the background), rank 0 last. Every rank ends with 0, the device ranks say
    when they joined and each round (none with --quiet), and the losses are the simulator's. The seed comes from a
    run file given to provision by its path here (``--config``): each rank reads its kit's copy. Before it, on the
    same broker, one device rank starts alone and is killed once it is at the broker (issue 67 P9: the next
    complete start then failed, poisoned by the aborted one's retained ready flag)."""
    (tmp_path / "options").mkdir()
    (tmp_path / "options" / "small.toml").write_text("seed = 5\n")
    seedless = [a for i, a in enumerate(SMALL) if "--seed" not in SMALL[max(i - 1, 0):i + 1]]
    out = provisioned(tmp_path, free_port(), train=[*seedless, "--config", str(tmp_path / "options" / "small.toml")])
    assert (out / "kits" / "rank3" / "config.toml").read_text() == "seed = 5\n"
    assert "--config config.toml" in (out / "kits" / "rank3" / "run.sh").read_text()
    broker = start_broker(out / "broker")
    env = {**os.environ, "ADAPTPLAN_PYTHON": sys.executable}
    try:
        kits = out / "kits"
        aborted = subprocess.Popen([str(kits / "rank2" / "run.sh")], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        wait_connected(aborted.pid, _port(out))
        time.sleep(1.0)                                      # subscribed and said ready
        aborted.kill()
        aborted.wait(timeout=10)
        others = {r: subprocess.Popen([str(kits / f"rank{r}" / "run.sh"), *(["--quiet"] if r == 4 else [])], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(1, 5)}
        edge = subprocess.run([str(kits / "rank0" / "run.sh"), "--no-progress", "--out", "run"], env=env,
                              capture_output=True, text=True, timeout=300)
        done = {r: p.communicate(timeout=60) for r, p in others.items()}
    finally:
        broker.terminate()
        broker.wait(timeout=10)
    assert edge.returncode == 0, edge.stderr
    assert all(others[r].returncode == 0 for r in others), done
    assert done[2][0].splitlines() == ["rank 2 (device 0): joined the run of 5 ranks at the broker "
                                       f"127.0.0.1:{_port(out)} (run {_run(out)})",
                                       *[f"rank 2 (device 0): round {t} done" for t in (1, 2, 3)]]
    assert done[1][0].splitlines()[-1] == "rank 1 (fed server): round 3 done"
    assert done[4][0] == ""                                                  # --quiet
    expected = simulate(tmp_path, "sim", [*SMALL, "--devices", "3", "--no-progress"])
    got = losses(kits / "rank0" / "run")
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def wait_connected(pid: int, port: int, seconds: float = 60) -> None:
    """Until process ``pid`` (or a child of it: run.sh execs python) holds an established TCP connection to
    127.0.0.1:``port`` (its sockets in /proc/<pid>/fd matched against /proc/net/tcp)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[2].endswith(f":{port:04X}") and fields[3] == "01" and fields[9] in inodes:
                return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} never connected to port {port}")


def _port(out: Path) -> int:
    return int((out / "kits" / "rank0" / "rank.env").read_text().split("ADAPTPLAN_MQTT_BROKER=127.0.0.1:")[1].split()[0])


def _run(out: Path) -> str:
    return (out / "kits" / "rank0" / "rank.env").read_text().split("ADAPTPLAN_MQTT_RUN=")[1].split()[0]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None or not _has_user("nobody"),
                    reason="starts the broker as a normal user (nobody) with runuser, which needs root")
def test_provisioned_by_a_normal_user_the_broker_runs_as_that_user_and_takes_the_ranks_logins(tmp_path, monkeypatch,
                                                                                             capsys) -> None:
    """A normal user's deployment: the configuration names that user, nothing is handed to another, and the broker
    started by that user from its folder takes a kit's login and refuses a wrong password."""
    import paho.mqtt.client as mqtt

    from trainers.distributed import provision as provision_module

    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(provision_module.os, "geteuid", lambda: nobody.pw_uid)
    chowned = []
    monkeypatch.setattr(provision_module.os, "chown", lambda *a: chowned.append(a))
    out = provisioned(tmp_path, free_port(), name="mine")
    monkeypatch.undo()                                                 # the real os.chown and geteuid again
    assert chowned == [] and "user nobody" in (out / "broker" / "mosquitto.conf").read_text().splitlines()
    for path in [out, out / "broker", *(out / "broker").iterdir()]:   # the folder as that user would own it
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    broker = start_broker(out / "broker", as_user="nobody")
    try:
        assert pwd.getpwuid(os.stat(f"/proc/{_child(broker.pid)}").st_uid).pw_name == "nobody"
        kit = out / "kits" / "rank2"
        results = {}
        for password in ((kit / "rank2.password").read_text().strip(), "wrong"):
            connected = []
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="rank2", protocol=mqtt.MQTTv311)
            client.username_pw_set("rank2", password)
            client.tls_set(ca_certs=str(kit / "ca.crt"))
            client.on_connect = lambda c, u, f, reason, p=None: connected.append(not reason.is_failure)
            client.connect("127.0.0.1", _port(out))
            client.loop_start()
            deadline = time.monotonic() + 5
            while not connected and time.monotonic() < deadline:
                time.sleep(0.02)
            client.loop_stop()
            client.disconnect()
            results[password == "wrong"] = connected
        assert results == {False: [True], True: [False]}
    finally:
        broker.terminate()
        broker.wait(timeout=10)


def _child(pid: int) -> int:
    """runuser's child (the broker itself), or ``pid``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    return int(entry.name)
            except (OSError, IndexError, ValueError):
                continue
    return pid


@pytest.mark.parametrize("existing", [False, True])
def test_a_full_disk_names_the_file_and_leaves_no_half_written_deployment(tmp_path, monkeypatch, capsys,
                                                                         existing) -> None:
    """Issue 67: provision on a full disk did not name the path and left what it had written. The 12th file (a
    kit's) cannot be written: the one line names it, exit 2, and the folder is as it was (absent, or empty)."""
    import errno

    from trainers.distributed import provision as provision_module

    real_open, opened = os.open, []

    def filling(path, flags, mode=0o777, **where):        # (shutil.rmtree opens with dir_fd=)
        opened.append(path)
        if len(opened) == 12:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode, **where)

    monkeypatch.setattr(provision_module.os, "open", filling)
    out = tmp_path / "deploy"
    if existing:
        out.mkdir()
    assert main(["provision", "--broker", "127.0.0.1:18999", "--devices", "3", "--out", str(out), "--", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err == (f"adaptplan provision: error: --out: cannot write the deployment into {str(out)!r} ({opened[11]}: "
                   "No space left on device); nothing of it was kept\n"), err
    assert "/kits/" in str(opened[11])
    assert (out.exists() and list(out.iterdir()) == []) if existing else not out.exists(), (
        list(out.rglob("*")) if out.exists() else None)


def test_a_failing_certificate_tool_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys) -> None:
    from trainers.distributed import provision as provision_module

    def failing(certificates, broker, host, days):
        raise RuntimeError("making the CA failed (1): unable to write 'random state'")

    monkeypatch.setattr(provision_module, "make_authority", failing)
    out = tmp_path / "deploy"
    assert main(["provision", "--broker", "127.0.0.1:18999", "--devices", "3", "--out", str(out), "--", *SMALL]) == 2
    assert capsys.readouterr().err == (f"adaptplan provision: error: --out: cannot write the deployment into "
                                       f"{str(out)!r} (making the CA failed (1): unable to write 'random state'); "
                                       "nothing of it was kept\n")
    assert not out.exists()
