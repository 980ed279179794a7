"""`fullthrottle submit`: what it sends, and how it fails against endpoints that are not there or
refuse. No KFP server exists here: the refusing endpoint is a real HTTP server on 127.0.0.1 that
answers 404 to everything (what a wrong URL looks like); nothing pretends to be KFP."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

from fullthrottle import cli
from fullthrottle.core.config import load_config
from pipelines.kubeflow_v2_runner import compile_pipeline, write_compiled


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    config = load_config(
        overrides=[
            "kubeflow.pipeline_root=s3://team-bucket/root",
            "kubeflow.image=reg.example/ft:7",
        ]
    )
    path = tmp_path_factory.mktemp("submit") / "spec.json"
    write_compiled(compile_pipeline(config), path)
    return path


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.fixture
def refusing_endpoint():
    class NotKFP(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404, "no such API here")

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotKFP)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_unreachable_endpoint_fails_naming_it(spec_file, capsys):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    assert cli.main(["submit", str(spec_file), "--endpoint", endpoint]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Kubeflow Pipelines at" in err and endpoint in err.replace("\n", " ")
    assert "Traceback" not in err


def test_refusing_endpoint_fails_naming_it_and_the_status(spec_file, refusing_endpoint, capsys):
    assert (
        cli.main(
            ["submit", str(spec_file), "--endpoint", refusing_endpoint, "--schedule", "0 3 * * *"]
        )
        == 2
    )
    err = capsys.readouterr().err.replace("\n", " ")
    assert refusing_endpoint in err and "refused" in err and "HTTP 404" in err


def test_dry_run_prints_the_request_and_contacts_nothing(spec_file, capsys):
    endpoint = f"http://127.0.0.1:{_closed_port()}"  # would fail if contacted
    code = cli.main(
        [
            "submit",
            str(spec_file),
            "--endpoint",
            endpoint,
            "--schedule",
            "30 2 * * 1",
            "--experiment",
            "nightly",
            "--dry-run",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{") :])
    assert request["endpoint"] == endpoint
    assert request["kind"] == "recurring run" and request["cron"] == "0 30 2 * * 1"
    assert request["experiment"] == "nightly"
    assert request["pipeline"] == "fullthrottle-penguins"
    assert request["pipeline_root"] == "s3://team-bucket/root/fullthrottle-penguins"
    assert request["images"] == ["reg.example/ft:7"]


def test_one_off_dry_run_has_no_schedule(spec_file, capsys):
    assert (
        cli.main(
            [
                "submit",
                str(spec_file),
                "--endpoint",
                "http://kfp.example",
                "--run-name",
                "try-1",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{") :])
    assert (request["kind"], request["cron"], request["name"]) == ("run", None, "try-1")


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["--schedule", "every day"], "has 2 fields"),
        (["--endpoint", "kfp.example:8080"], "must be a URL"),
    ],
)
def test_bad_arguments_are_named(spec_file, capsys, argv_tail, message):
    argv = ["submit", str(spec_file), "--endpoint", "http://kfp.example", "--dry-run", *argv_tail]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_file_that_is_not_a_spec_is_named(tmp_path, capsys):
    bogus = tmp_path / "notes.json"
    bogus.write_text('{"hello": 1}')
    assert cli.main(["submit", str(bogus), "--endpoint", "http://kfp.example", "--dry-run"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert str(bogus) in err and "not a compiled KFP pipeline spec" in err
