"""Runs one model's trainer benchmarks in this process: ``python -m fullthrottle.bench.model_process
JOB_DIR`` reads ``JOB_DIR/request.pickle`` (written by ``suite.measure_model_in_process``, or by
``suite.measure_input_pairs_in_process`` for input efficiency's pairs alone) and writes
``JOB_DIR/result.json``. A failure exits non-zero with the trace on stderr."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from fullthrottle.bench.suite import measure_input_pairs, measure_model

    job = Path(argv[0])
    request = pickle.loads((job / "request.pickle").read_bytes())
    if request.get("kind") == "input_pairs":
        result = measure_input_pairs(request["data"], request["config"], request["sizes"])
    else:
        result = measure_model(
            request["data"], request["config"], request["sizes"], request["window"], request["name"]
        )
    tmp = job / "result.json.tmp"
    tmp.write_text(json.dumps(result, default=str), encoding="utf-8")
    tmp.replace(job / "result.json")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with the Transformer's contenders (traced loops, live
    # tf.data iterators) it took 87 s after the result was written, a third of the quick suite.
    os._exit(code)
