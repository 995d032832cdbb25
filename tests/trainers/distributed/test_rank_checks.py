"""trainers.distributed.rank_checks: a device rank's Ready and Report, each rule at its edge (the last value taken and
the first refused); test_distributed_runtime.py shows rank 0 turning a refusal into the rank's failure."""

from __future__ import annotations

import math
import re

import pytest

from trainers.distributed.control import Ready, Report
from trainers.distributed.rank_checks import MAX_STAGE_SECONDS, check_ready, check_report
from trainers.engine.clock import STAGES
from trainers.roles.checks import BadMessageError


def test_an_honest_report_passes_at_the_edges_of_its_rules() -> None:
    check_report(Report({}), 2, [0, 2])                                        # nothing measured
    check_report(Report({stage: {0: 0.0, 2: MAX_STAGE_SECONDS} for stage in STAGES}), 2, [0, 2])
    check_report(Report({"uplink": {2: 3}}), 2, [0, 2])                        # whole seconds


@pytest.mark.parametrize(("report", "text"), [
    (Report({"uplink": {0: math.nextafter(MAX_STAGE_SECONDS, math.inf)}}),
     "seconds['uplink'][0]: is 1000000.0000000001, expected a finite number of seconds in [0, 1e+06]"),
    (Report({"uplink": {0: -1e-300}}), "seconds['uplink'][0]: is -1e-300, expected"),
    (Report({"uplink": {0: math.nan}}), "seconds['uplink'][0]: is nan, expected"),
    (Report({"uplink": {0: 10 ** 400}}), "seconds['uplink'][0]: is an integer of about 401 digits, expected"),
    (Report({"uplink": {0: True}}), "seconds['uplink'][0]: is True, expected"),
    (Report({"uplink": {1: 0.5}}), "seconds['uplink']: names 1, not one of its devices [0, 2]"),
    (Report({"uplink": {True: 0.5}}), "seconds['uplink']: names True, not one of its devices [0, 2]"),
    (Report({"uplink": {"0": 0.5}}), "seconds['uplink']: names '0', not one of its devices [0, 2]"),
    (Report({"Uplink": {0: 0.5}}), "seconds: names the stage 'Uplink'; the stages are device FP, uplink, server, "),
    (Ready([0, 2]), "type: is Ready, expected Report (the answer to RoundEnd)"),
])
def test_a_report_that_breaks_a_rule_names_the_rank_and_the_field(report: object, text: str) -> None:
    with pytest.raises(BadMessageError) as caught:
        check_report(report, 2, [0, 2])
    assert str(caught.value).startswith(f"rank 2's report: {text}")
    assert caught.value.device == "rank 2"


def test_a_set_up_reply_names_exactly_the_devices_given() -> None:
    check_ready(Ready([2, 0]), 2, [0, 2])                                      # in any order
    for msg, text in [(Ready([0]), "devices: are [0], expected [0, 2]"), (Ready([0, 2, 4]), "devices: are [0, 2, 4]"),
                      (Report({}), "type: is Report, expected Ready")]:
        with pytest.raises(BadMessageError, match="^" + re.escape(f"rank 2's set-up reply: {text}")):
            check_ready(msg, 2, [0, 2])
