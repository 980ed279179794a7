"""The exit statuses of the `fullthrottle` commands, each named once.

| status | name | when |
|---|---|---|
| 0 | `SUCCESS` | done (`run`: a model was pushed) |
| 1 | `FINDINGS` | `doctor` found a mismatch to act on; `bench` had a benchmark fail |
| 2 | `USER_ERROR` | bad input, a failed component, the output folder in use by another run, too little free space: a one-paragraph message says what, where and what to do |
| 3 | `NOT_BLESSED` | `run`: the Evaluator did not bless the model; nothing was pushed |
| 130, 143 | `interrupted(signum)` | stopped by SIGINT (Ctrl-C) or SIGTERM, as a shell reports a process those signals ended |
"""

from __future__ import annotations

import signal

SUCCESS = 0
FINDINGS = 1
USER_ERROR = 2
NOT_BLESSED = 3


def interrupted(signum: int | None) -> int:
    """The status of a command stopped by ``signum`` (SIGTERM when unknown: another worker's
    stop request): 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum or signal.SIGTERM)
