"""How an MQTT rank logs in to the broker (docs/mqtt.md): the ``ADAPTPLAN_MQTT_*`` variables, the rank's user
name and topics. Torch-free, so that ``adaptplan provision`` and the local broker write what the runtime
(:mod:`trainers.distributed.mqtt`) reads without loading torch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from adaptplan.errors import InputError
from trainers.distributed.environment import check_private

BROKER_ENV = "ADAPTPLAN_MQTT_BROKER"          # host:port
CA_ENV = "ADAPTPLAN_MQTT_CA"                  # the CA certificate's file
PASSWORD_FILE_ENV = "ADAPTPLAN_MQTT_PASSWORD_FILE"
RUN_ENV = "ADAPTPLAN_MQTT_RUN"                # the run's topic prefix


def user(rank: int) -> str:
    """The broker user name (and topic level) of ``rank``."""
    return f"rank{rank}"


def frame_topic(run: str, dst: int, src: int) -> str:
    return f"ap/{run}/to/{user(dst)}/from/{user(src)}"


@dataclass(frozen=True)
class BrokerLogin:
    """What a rank needs to reach the broker: its address, the CA certificate that signed the
    broker's, the run's topic prefix, and this rank's password."""

    host: str
    port: int
    ca_file: str
    run: str
    password: str


def broker_login(environ: Mapping[str, str] = os.environ) -> BrokerLogin:
    """The login from ``ADAPTPLAN_MQTT_*`` (the password from a file, never the command line)."""
    missing = [name for name in (BROKER_ENV, CA_ENV, PASSWORD_FILE_ENV, RUN_ENV) if not environ.get(name)]
    if missing:
        raise InputError(f"an mqtt rank needs {', '.join(missing)} (docs/mqtt.md); adaptplan train --runtime mqtt "
                         "sets them for the ranks it starts", field=missing[0])
    host, _, port = environ[BROKER_ENV].rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"{BROKER_ENV} is {environ[BROKER_ENV]!r}, not host:port", field=BROKER_ENV)
    try:
        check_private(environ[PASSWORD_FILE_ENV], PASSWORD_FILE_ENV)
        password = open(environ[PASSWORD_FILE_ENV], encoding="utf-8").read().strip()
    except OSError as exc:
        raise InputError(f"{PASSWORD_FILE_ENV}: {environ[PASSWORD_FILE_ENV]!r} cannot be read ({exc.strerror})",
                         field=PASSWORD_FILE_ENV) from None
    return BrokerLogin(host, int(port), environ[CA_ENV], environ[RUN_ENV], password)
