"""Bad input stops `fullthrottle run` before any work, with one paragraph naming the problem.

One case runs `fullthrottle` as a user does, in a fresh process (its exit status, its stderr);
the others call the same entry point in this process (`fullthrottle.cli.main`, what
`python -m fullthrottle` calls): a fresh process costs seconds of TensorFlow import per case
and tells nothing more about the message.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fullthrottle.cli import main
from tests.helpers import run_cli, served_dirs

PENGUIN_HEADER = (
    "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
)
PENGUIN_ROW = "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n"


def _in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """`fullthrottle ARGS` through the command line's entry point, in this process."""
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def _assert_stopped(result, output_dir: Path, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr[-3000:])
    stderr = result.stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    message = stderr.strip().splitlines()
    joined = " ".join(message)
    assert "error:" in joined
    for needle in needles:
        assert needle in joined, (needle, joined)
    assert served_dirs(output_dir / "serving" / "penguins") == []
    # Stopped before the pipeline: no metadata store, no component output.
    assert not (output_dir / "metadata").exists()


def test_missing_data_path(tmp_path):
    missing = tmp_path / "nope.csv"
    result = run_cli("run", "--output-dir", str(tmp_path / "out"), "--data", str(missing))
    _assert_stopped(result, tmp_path / "out", str(missing), "data.path", "does not exist")


def test_empty_csv(tmp_path, capsys):
    data = tmp_path / "empty.csv"
    data.write_text("")
    result = _in_process(capsys, "run", "--output-dir", str(tmp_path / "out"), "--data", str(data))
    _assert_stopped(result, tmp_path / "out", str(data), "empty")


def test_header_only_csv(tmp_path, capsys):
    data = tmp_path / "header.csv"
    data.write_text(PENGUIN_HEADER)
    result = _in_process(capsys, "run", "--output-dir", str(tmp_path / "out"), "--data", str(data))
    _assert_stopped(result, tmp_path / "out", str(data), "no rows")


def test_csv_without_label_column(tmp_path, capsys):
    data = tmp_path / "nolabel.csv"
    header = PENGUIN_HEADER.replace("species,", "")
    data.write_text(header + PENGUIN_ROW.replace("Adelie,", "") * 5)
    result = _in_process(capsys, "run", "--output-dir", str(tmp_path / "out"), "--data", str(data))
    _assert_stopped(result, tmp_path / "out", str(data), "'species'", "data.label")


def test_config_naming_a_missing_column(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("data:\n  numeric: [bill_length_mm, wingspan_cm]\n")
    result = _in_process(
        capsys, "run", "--output-dir", str(tmp_path / "out"), "--config", str(config)
    )
    _assert_stopped(result, tmp_path / "out", "'wingspan_cm'", "data.numeric")


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("trainig.train_steps=5", ("unknown config key", "trainig", "training")),
        ("training.train_steps=lots", ("training.train_steps", "integer")),
        ("training.per_replica_batch_size=-4", ("per_replica_batch_size", "-4")),
        ("training.precision=float8", ("precision", "float8")),
        ("beam.direct_running_mode=fast", ("beam.direct_running_mode",)),
    ],
)
def test_config_errors_name_the_field(tmp_path, override, needles, capsys):
    result = _in_process(capsys, "run", "--output-dir", str(tmp_path / "out"), "--set", override)
    _assert_stopped(result, tmp_path / "out", *needles)


def test_debug_flag_shows_the_trace(tmp_path, capsys):
    result = _in_process(
        capsys,
        "--debug",
        "run",
        "--output-dir",
        str(tmp_path / "out"),
        "--data",
        str(tmp_path / "nope.csv"),
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr
