"""`fullthrottle submit`: what it sends, and how it fails against endpoints that are not there or
refuse. No KFP server exists here: the endpoints are real HTTP servers on 127.0.0.1 that answer
404 to everything (what a wrong URL looks like), or answer KFP's health check and refuse the rest
with 401 while recording what arrived, so that the credentials kfp.Client sends can be read off
the wire; nothing pretends to run a pipeline."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from fullthrottle import cli
from fullthrottle.core.config import load_config
from pipelines.kubeflow_v2_runner import compile_pipeline, write_compiled
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory):
    config = load_config(
        overrides=[
            "kubeflow.pipeline_root=gs://team-bucket/root",
            "kubeflow.image=reg.example/ft:7",
        ]
    )
    path = tmp_path_factory.mktemp("submit") / "spec.yaml"
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
    assert request["pipeline_root"] == "gs://team-bucket/root/fullthrottle-penguins"
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
    bogus = tmp_path / "notes.yaml"
    bogus.write_text('{"hello": 1}')
    assert cli.main(["submit", str(bogus), "--endpoint", "http://kfp.example", "--dry-run"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert str(bogus) in err and "not a compiled KFP pipeline spec" in err


@pytest.fixture
def recording_endpoint():
    """Answers KFP's health check (single-user) and refuses everything else with 401, keeping
    each request's path and headers."""
    seen: list[tuple[str, str, dict]] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            # Header names are case-insensitive (kfp_server_api sends `authorization`).
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if self.command == "GET" and self.path.split("?")[0].endswith("/apis/v2beta1/healthz"):
                body, status = b'{"multi_user": false}', 200
            else:
                body, status = b'{"error": "no credentials accepted here", "code": 16}', 401
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    ("flag", "secret", "header", "expected"),
    [
        ("--token-file", "s3cr3t-token\n", "authorization", "Bearer s3cr3t-token"),
        ("--cookie-file", "authservice_session=abc123", "cookie", "authservice_session=abc123"),
    ],
)
def test_credentials_reach_the_endpoint_the_way_kfp_client_sends_them(
    spec_file, recording_endpoint, tmp_path, capsys, flag, secret, header, expected
):
    endpoint, seen = recording_endpoint
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    assert cli.main(["submit", str(spec_file), "--endpoint", endpoint, flag, str(secret_file)]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "refused the run: HTTP 401" in err and "Traceback" not in err
    # Our health check and kfp.Client's own API calls carried the credentials.
    assert seen[0][1] == "/apis/v2beta1/healthz" and seen[0][2].get(header) == expected
    api_calls = [(path, headers) for _, path, headers in seen[1:]]
    assert api_calls and all(h.get(header) == expected for _, h in api_calls), [
        (p, h.get(header)) for p, h in api_calls
    ]
    assert any(path.startswith("/apis/v2beta1/") for path, _ in api_calls)
    # ... and the secret stays out of what is printed.
    assert secret.strip() not in err


def test_refused_credentials_are_reported_before_kfp_client_starts(spec_file, tmp_path, capsys):
    class Unauthorized(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(401, "who are you")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("expired")
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        assert (
            cli.main(["submit", str(spec_file), "--endpoint", endpoint, "--token-file", str(token)])
            == 2
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    err = capsys.readouterr().err.replace("\n", " ")
    assert "refused the credentials" in err and "HTTP 401" in err and "--token-file" in err


def test_without_an_endpoint_the_kube_config_s_cluster_and_credentials_are_used(
    spec_file, recording_endpoint, tmp_path
):
    endpoint, seen = recording_endpoint
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kind-ft", "cluster": {"server": endpoint}}],
                "users": [{"name": "dev", "user": {"token": "kube-token"}}],
                "contexts": [{"name": "kind-ft", "context": {"cluster": "kind-ft", "user": "dev"}}],
                "current-context": "kind-ft",
            }
        )
    )
    # A fresh process: the kubernetes client reads $KUBECONFIG when it is imported. Its own
    # home: no ~/.config/kfp/context.json of the user's.
    done = run_cli(
        "submit",
        str(spec_file),
        "--kube-context",
        "kind-ft",
        env={"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), "KF_PIPELINES_ENDPOINT": ""},
    )
    assert done.returncode == 2 and "HTTP 401" in done.stderr, done.stderr[-2000:]
    proxy = "/api/v1/namespaces/kubeflow/services/ml-pipeline:http/proxy/apis/v2beta1/"
    assert seen and all(path.startswith(proxy) for _, path, _ in seen), [p for _, p, _ in seen]
    assert all(headers.get("authorization") == "Bearer kube-token" for _, _, headers in seen)


@pytest.mark.parametrize(
    ("argv_tail", "message"),
    [
        (["--token-file", "t", "--cookie-file", "c"], "not both"),
        (["--kube-context", "kind-ft"], "drop --endpoint"),
    ],
)
def test_credential_flags_that_contradict_each_other_are_refused(
    spec_file, capsys, argv_tail, message
):
    argv = ["submit", str(spec_file), "--endpoint", "http://kfp.example", *argv_tail]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_missing_token_file_is_named(spec_file, tmp_path, capsys):
    missing = Path(tmp_path / "nope")
    argv = [
        "submit",
        str(spec_file),
        "--endpoint",
        "http://kfp.example",
        "--token-file",
        str(missing),
    ]
    assert cli.main(argv) == 2
    # Wrapped to 100 columns wherever the path's length puts the breaks.
    said = " ".join(capsys.readouterr().err.split())
    assert f"cannot read the token file {missing}" in said
