"""What a rank reads from its environment besides torchrun's: the run's secret, the local store,
the wire trace (docs/distributed.md, "Security").

* ``ADAPTPLAN_SECRET_FILE`` (a file holding the secret) or ``ADAPTPLAN_SECRET`` (the secret itself):
  every frame is authenticated with a key derived from it (HMAC-SHA256, :mod:`trainers.distributed.wire`).
  It is never taken from the command line (other users of a machine can read command lines).
  ``adaptplan train --distributed`` on one machine makes a fresh one for its ranks.
* ``ADAPTPLAN_STORE_FILE``: the rendezvous store is this file (``torch.distributed.FileStore``)
  instead of a TCP store: the local launcher uses a file in a folder only its user can read, so a
  local run opens no socket beyond gloo's pairs, which are bound to loopback.
* ``ADAPTPLAN_WIRE_TRACE``: a folder; every rank appends one JSON line per frame it receives (sender,
  receiver, dtype and shape of each tensor): what crossed the wire, for audits and tests.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Mapping

from adaptplan.errors import InputError

SECRET_ENV = "ADAPTPLAN_SECRET"
SECRET_FILE_ENV = "ADAPTPLAN_SECRET_FILE"
STORE_ENV = "ADAPTPLAN_STORE_FILE"
TRACE_ENV = "ADAPTPLAN_WIRE_TRACE"
RUNTIME_ENV = "ADAPTPLAN_RUNTIME"   # "mqtt": the ranks meet at a broker (trainers/distributed/mqtt.py)
MIN_SECRET_BYTES = 16


def check_private(path: str, field: str) -> None:
    """Refuse a secret or password file that users other than its owner may read or write (issue 67: a kit's
    ``run.secret`` readable by everyone was used without a word): one InputError naming the file and the fix."""
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise InputError(f"{path!r} can be read or written by other users (mode {mode & 0o777:o}): whoever reads it "
                         f"can join the run; chmod 600 {path}", field=field)


def run_key(environ: Mapping[str, str] = os.environ) -> bytes:
    """The 32-byte key that authenticates this run's frames, derived from its secret; an
    :class:`InputError` naming the variable when there is none or it is too short to be one."""
    path = environ.get(SECRET_FILE_ENV)
    if path:
        try:
            check_private(path, SECRET_FILE_ENV)
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise InputError(f"cannot read the run's secret from {path!r}: {exc.strerror or exc}",
                             field=SECRET_FILE_ENV) from None
        where = f"the file {path!r}"
        field = SECRET_FILE_ENV
    elif environ.get(SECRET_ENV):
        secret, where, field = environ[SECRET_ENV].strip().encode(), SECRET_ENV, SECRET_ENV
    else:
        raise InputError(f"a rank needs the run's shared secret: set {SECRET_FILE_ENV} to a file holding it (the same "
                         f"secret on every machine, e.g. from 'openssl rand -hex 32'), or {SECRET_ENV}; adaptplan "
                         "train --distributed on one machine makes one for its ranks itself", field=SECRET_FILE_ENV)
    if len(secret) < MIN_SECRET_BYTES:
        raise InputError(f"{where} holds {len(secret)} bytes; a secret needs at least {MIN_SECRET_BYTES} "
                         "(e.g. 'openssl rand -hex 32')", field=field)
    return hashlib.sha256(b"adaptplan run secret\0" + secret).digest()


def store_file(environ: Mapping[str, str] = os.environ) -> str | None:
    """The local run's rendezvous file, or None (a TCP store at MASTER_ADDR:MASTER_PORT)."""
    return environ.get(STORE_ENV) or None


def wire_trace(rank: int, environ: Mapping[str, str] = os.environ) -> Callable | None:
    """A receiver hook appending each received frame's tensors to ``$ADAPTPLAN_WIRE_TRACE/rank<r>.jsonl``."""
    folder = environ.get(TRACE_ENV)
    if not folder:
        return None
    path = Path(folder) / f"rank{rank}.jsonl"

    def record(frame) -> None:
        line = {"src": frame.src, "dst": frame.dst, "seq": frame.seq,
                "tensors": [[dtype, list(shape)] for dtype, shape in frame.tensors]}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")

    return record
