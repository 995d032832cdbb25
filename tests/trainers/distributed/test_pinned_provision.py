"""What ``adaptplan provision`` and the local broker write, pinned against docs/mqtt.md without a broker
(tests/trainers/distributed/test_provision.py runs the whole recipe where mosquitto is installed): the broker
address's port at its edges, a kit's ``rank.env`` as the docs' block lists it, the settings both written
``mosquitto.conf`` share, the access control list's lines and the topics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adaptplan.errors import InputError
from trainers.distributed.broker import BrokerLimits, acl_text, broker_settings
from trainers.distributed.mqtt_login import frame_topic
from trainers.distributed.provision import broker_config, rank_env, split_address

ROOT = Path(__file__).resolve().parents[3]
MQTT_DOC = (ROOT / "docs" / "mqtt.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("address, expected", [("broker.example.org:8883", ("broker.example.org", 8883)),
                                               ("h:1", ("h", 1)), ("h:65535", ("h", 65535)),
                                               ("10.0.0.1:65535", ("10.0.0.1", 65535)),
                                               ("[::1]:65535", ("::1", 65535))])
def test_a_broker_port_in_1_to_65535_is_taken(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["h:0", "h:65536", "h:99999", "[::1]:65536", "10.0.0.1:65536", "h:-1", "h:"])
def test_a_port_outside_1_to_65535_is_refused_naming_broker(address: str) -> None:
    with pytest.raises(InputError) as caught:
        split_address(address)
    assert caught.value.field == "--broker" and "is not host:port" in caught.value.message


def documented_rank_env() -> dict[str, str]:
    """The variables of docs/mqtt.md's "What a kit's `rank.env` sets" block, as written there."""
    block = MQTT_DOC.split("What a kit's `rank.env` sets", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return dict(re.findall(r"([A-Z_]+)=(\S+)", block))


def test_a_kits_rank_env_is_the_documented_block() -> None:
    documented = documented_rank_env()
    assert documented["ADAPTPLAN_MQTT_PASSWORD_FILE"] == "rank2.password"     # the block is the one meant
    written = dict(line.split("=", 1) for line in rank_env(2, 5, "broker.example.org", 8883, "exp1").splitlines())
    assert written == {k: v.replace("<run>", "exp1") for k, v in documented.items()}


def test_each_rank_names_its_own_password_file() -> None:
    for rank in (0, 1, 4):
        written = dict(line.split("=", 1) for line in rank_env(rank, 5, "h", 1, "r").splitlines())
        assert written["ADAPTPLAN_MQTT_PASSWORD_FILE"] == f"rank{rank}.password"
        assert written["RANK"] == str(rank) and written["WORLD_SIZE"] == "5"


def test_both_broker_configurations_bind_the_client_id_and_retain_nothing() -> None:
    """docs/mqtt.md: no anonymous clients, "the broker gives every client its user name as its client id
    (`use_username_as_clientid true`)", nothing retained (`retain_available false`), no persistence; provision's
    configuration listens on the broker's port with the files of its folder."""
    limits = BrokerLimits.for_run(5, 10_000)
    for text in (broker_settings(limits), broker_config(8883, "mosquitto", limits)):
        lines = text.splitlines()
        for line in ("use_username_as_clientid true", "allow_anonymous false", "retain_available false",
                     "persistence false", "password_file passwd", "acl_file acl"):
            assert line in lines, line
        assert not any(line.startswith("use_username_as_clientid") and line != "use_username_as_clientid true"
                       for line in lines)
    conf = broker_config(8883, "mosquitto", limits).splitlines()
    for line in ("listener 8883", "user mosquitto", "cafile ca.crt", "certfile broker.crt", "keyfile broker.key"):
        assert line in conf, line
    # docs: 64 frames per peer (max_queued_messages = 64 × (W − 1)), 4 largest frames' bytes per peer, packets of
    # the largest frame plus 1 KiB
    assert f"max_queued_messages {64 * 4}" in conf and f"max_packet_size {10_000 + 1024}" in conf
    assert f"max_queued_bytes {4 * 4 * (10_000 + 1024)}" in conf


def test_the_access_list_is_the_documented_patterns() -> None:
    """docs/mqtt.md "Topics, credentials, access": `pattern read ap/<run>/to/%u/#`, one `pattern write
    ap/<run>/to/rank<d>/from/%u` per rank d of the run, and every rank reads every ready flag and will."""
    lines = acl_text("exp1", 3).splitlines()
    assert sorted(lines) == sorted(["pattern write ap/exp1/to/rank0/from/%u", "pattern write ap/exp1/to/rank1/from/%u",
                                    "pattern write ap/exp1/to/rank2/from/%u", "pattern read ap/exp1/to/%u/#",
                                    "pattern readwrite ap/exp1/ready/%u", "pattern read ap/exp1/ready/+",
                                    "pattern write ap/exp1/gone/%u", "pattern read ap/exp1/gone/+"])
    for documented in ("pattern read ap/<run>/to/%u/#", "pattern read\nap/<run>/ready/+", "pattern read ap/<run>/gone/+"):
        assert documented in MQTT_DOC, documented


def test_a_frame_goes_to_the_documented_topic() -> None:
    """docs/mqtt.md: `ap/<run>/to/rank<d>/from/rank<s>`, written by rank s, a frame for rank d."""
    assert "`ap/<run>/to/rank<d>/from/rank<s>`" in MQTT_DOC
    assert frame_topic("exp1", 3, 2) == "ap/exp1/to/rank3/from/rank2"
