"""`fullthrottle submit SPEC`: send a compiled spec to Kubeflow Pipelines, once or on a schedule.

Credentials go the ways `kfp.Client` takes them: a bearer token (`--token-file`: a Kubernetes
service account token, an OIDC or IAP token) or a session cookie (`--cookie-file`, e.g. Dex's
`authservice_session` of a multi-user Kubeflow) sent to `--endpoint`; or, without an endpoint,
your kube config's credentials (`--kube-context`), through the Kubernetes API server's proxy to
the `ml-pipeline` service. With an endpoint it is checked first with one short request
(`/apis/v2beta1/healthz`, with the same credentials), so an unreachable or refusing endpoint is
reported in seconds, by name, before `kfp.Client` (whose own start-up retries for much longer)
is involved. `--dry-run` prints what would be sent and contacts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError, FullthrottleError

HEALTHZ = "/apis/v2beta1/healthz"
# Where the Kubernetes API server proxies to KFP's API service (kfp.Client's own kube route).
KUBE_PROXY_PATH = "api/v1/namespaces/{namespace}/services/ml-pipeline:http/proxy"
ENDPOINT_ENV = "KF_PIPELINES_ENDPOINT"  # the variable kfp.Client reads too
CONNECT_SECONDS = 5.0
READ_SECONDS = 15.0


class SubmitError(FullthrottleError):
    """The KFP endpoint is unreachable or refused the request; the message names the endpoint."""


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "submit",
        help="send a compiled spec to a Kubeflow Pipelines endpoint (one run, or recurring)",
        description=(
            "Sends a spec written by `fullthrottle compile --target kubeflow` to a KFP v2 API "
            "endpoint with kfp.Client: one run, or with --schedule a recurring run. Credentials: "
            "--token-file or --cookie-file for the endpoint, or without --endpoint your kube "
            "config's. "
            "--dry-run prints what would be sent without contacting anything."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle submit fullthrottle-kubeflow.yaml --endpoint http://127.0.0.1:8080\n"
            "  fullthrottle submit spec.yaml --endpoint https://kubeflow.example --cookie-file c.txt\n"
            "  fullthrottle submit spec.yaml --kube-context kind-kind --namespace kubeflow\n"
            "  fullthrottle submit spec.yaml --endpoint http://kfp --schedule '0 0 3 * * *'\n"
            "  fullthrottle submit spec.yaml --endpoint http://kfp --dry-run"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC", help="the compiled pipeline IR YAML")
    parser.add_argument(
        "--endpoint",
        help=f"KFP API URL, e.g. http://127.0.0.1:8080 (default: ${ENDPOINT_ENV}; neither: "
        "your kube config's cluster, through the API server's proxy)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a bearer token for the endpoint (e.g. `kubectl create token default-editor -n "
        "NAMESPACE > FILE`); kept out of the command line and the process list",
    )
    parser.add_argument(
        "--cookie-file",
        metavar="FILE",
        help="cookies for the endpoint as NAME=VALUE[; NAME=VALUE] (a multi-user Kubeflow's "
        "`authservice_session=...` from a logged-in browser)",
    )
    parser.add_argument(
        "--kube-context",
        metavar="NAME",
        help="without --endpoint: the kube config context to use (default: the current one)",
    )
    parser.add_argument(
        "--ca-cert", metavar="FILE", help="CA bundle that signed the endpoint's TLS certificate"
    )
    parser.add_argument(
        "--namespace", default="kubeflow", help="KFP namespace (multi-user installs)"
    )
    parser.add_argument(
        "--experiment", default="fullthrottle", help="experiment to file the run under"
    )
    parser.add_argument(
        "--run-name", help="run (or recurring run) name (default: the pipeline name)"
    )
    parser.add_argument(
        "--schedule",
        metavar="CRON",
        help="make a recurring run: KFP's 6-field cron (sec min hour day month weekday), "
        "or a 5-field one (a seconds field of 0 is prepended)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be sent; contact nothing"
    )
    return parser


def read_spec(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compiled pipeline's (pipeline spec, platform spec) dicts, loaded by KFP's own loader
    first; refuses anything that is not one, naming the file."""
    import yaml
    from kfp import components

    if not path.is_file():
        raise ConfigError(
            f"spec {path} does not exist; write one with `fullthrottle compile --target kubeflow -o {path}`"
        )
    try:
        components.load_component_from_file(str(path))
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        pipeline_spec = documents[0]
        platform_spec = documents[1] if len(documents) > 1 else {}
        pipeline_spec["deploymentSpec"]["executors"]
    except Exception as exc:  # noqa: BLE001 (whatever the loader raises, the file is not a spec)
        raise ConfigError(
            f"{path} is not a compiled KFP pipeline spec ({type(exc).__name__}: {exc}); "
            "write one with `fullthrottle compile --target kubeflow`"
        ) from None
    return pipeline_spec, platform_spec


def kfp_cron(expression: str) -> str:
    """KFP's 6-field cron from a 5- or 6-field one; refuses other shapes with the expected form."""
    fields = expression.split()
    if len(fields) == 5:
        return " ".join(["0", *fields])
    if len(fields) == 6:
        return " ".join(fields)
    raise ConfigError(
        f"--schedule {expression!r} has {len(fields)} fields; give 6 (sec min hour day month weekday, "
        "e.g. '0 0 3 * * *' for 03:00 daily) or a standard 5-field cron"
    )


def plan(args: argparse.Namespace, pipeline_spec: dict[str, Any]) -> dict[str, Any]:
    """Everything the request will carry, decided before any connection (credentials by where
    they come from, never their value)."""
    pipeline_name = pipeline_spec.get("pipelineInfo", {}).get("name", "pipeline")
    images = sorted(
        {
            e["container"]["image"]
            for e in pipeline_spec.get("deploymentSpec", {}).get("executors", {}).values()
            if "container" in e
        }
    )
    if args.endpoint:
        credentials = (
            f"bearer token from {args.token_file}"
            if args.token_file
            else f"cookies from {args.cookie_file}"
            if args.cookie_file
            else "none (kfp.Client's own: ~/.config/kfp/context.json, KF_PIPELINES_* variables)"
        )
    else:
        credentials = f"kube config context {args.kube_context or '(current)'}"
    return {
        "endpoint": args.endpoint
        or f"the Kubernetes API server's proxy to ml-pipeline in namespace {args.namespace}",
        "credentials": credentials,
        "namespace": args.namespace,
        "experiment": args.experiment,
        "kind": "recurring run" if args.schedule else "run",
        "name": args.run_name or pipeline_name,
        "cron": kfp_cron(args.schedule) if args.schedule else None,
        "pipeline": pipeline_name,
        "pipeline_root": pipeline_spec.get("defaultPipelineRoot"),
        "images": images,
        "spec_file": args.spec,
    }


def read_secret(path: str, what: str) -> str:
    """The stripped content of a credentials file; refuses a missing or empty one by name."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(f"the {what} file {path} is empty")
    return value


def kube_proxy_endpoint(
    kube_context: str | None, namespace: str
) -> tuple[str | None, str | None, str | None]:
    """(endpoint, bearer token, CA file) of KFP's API through the Kubernetes API server's proxy,
    from the kube config, for a kube config user with a token. kfp.Client's own kube route
    builds the same URL, but the kubernetes client's token refresh hook resets the host to the
    API server's on the first request, so the proxy path is lost; a user with a client
    certificate has no such hook: (None, None, None) leaves that case to kfp.Client."""
    import kfp_server_api
    from kubernetes import config as kube_config

    configuration = kfp_server_api.Configuration()
    try:
        kube_config.load_kube_config(client_configuration=configuration, context=kube_context)
    except (kube_config.ConfigException, OSError, TypeError) as exc:
        raise ConfigError(
            f"no --endpoint, and the kube config cannot be read ({exc}): give --endpoint (e.g. "
            "after `kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80`, "
            "http://127.0.0.1:8080) or fix the kube config / --kube-context"
        ) from None
    token = configuration.api_key.get("authorization", "").removeprefix("Bearer ").strip()
    if not token:
        return None, None, None
    endpoint = f"{configuration.host.rstrip('/')}/{KUBE_PROXY_PATH.format(namespace=namespace)}"
    return endpoint, token, configuration.ssl_ca_cert


def check_endpoint(
    endpoint: str, *, headers: dict[str, str] | None = None, ca_cert: str | None = None
) -> None:
    """One short GET of KFP's health check with the run's credentials; raises SubmitError
    naming the endpoint."""
    import urllib3

    url = endpoint.rstrip("/") + HEALTHZ
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS),
        retries=False,
        **({"ca_certs": ca_cert} if ca_cert else {}),
    )
    try:
        response = http.request("GET", url, headers=headers or {})
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SubmitError(
            f"cannot reach Kubeflow Pipelines at {endpoint} ({reason}). Check --endpoint: the KFP API "
            "or UI service, e.g. after `kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80` "
            "use http://127.0.0.1:8080"
        ) from None
    if response.status in (401, 403):
        raise SubmitError(
            f"Kubeflow Pipelines at {endpoint} refused the credentials: GET {HEALTHZ} answered "
            f"HTTP {response.status}. Give a valid --token-file or --cookie-file (docs/kubeflow.md, "
            "multi-user Kubeflow)"
        )
    if response.status != 200:
        raise SubmitError(
            f"Kubeflow Pipelines at {endpoint} refused: GET {HEALTHZ} answered HTTP {response.status}. "
            "Is this a KFP v2 API endpoint (and does it need authentication)?"
        )


def run(args: argparse.Namespace) -> int:
    pipeline_spec, _ = read_spec(Path(args.spec))
    args.endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV)
    if args.endpoint and "://" not in args.endpoint:
        raise ConfigError(
            f"--endpoint {args.endpoint!r} must be a URL such as http://127.0.0.1:8080"
        )
    if args.token_file and args.cookie_file:
        raise ConfigError("give --token-file or --cookie-file, not both")
    if not args.endpoint and (args.token_file or args.cookie_file):
        raise ConfigError(
            "--token-file and --cookie-file are sent to an endpoint: give --endpoint (without "
            "one, submit uses your kube config's credentials)"
        )
    if args.endpoint and args.kube_context:
        raise ConfigError(
            "--kube-context is for submitting through your kube config; drop --endpoint to use it"
        )
    request = plan(args, pipeline_spec)
    if args.dry_run:
        print("fullthrottle submit --dry-run: would send (nothing was contacted):")
        print(json.dumps(request, indent=2))
        return exit_status.SUCCESS
    token = read_secret(args.token_file, "token") if args.token_file else None
    cookies = read_secret(args.cookie_file, "cookie") if args.cookie_file else None
    if not args.endpoint:
        args.endpoint, token, args.ca_cert = kube_proxy_endpoint(args.kube_context, args.namespace)
    if args.endpoint:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if cookies:
            headers["Cookie"] = cookies
        check_endpoint(args.endpoint, headers=headers, ca_cert=args.ca_cert)
    client_args = {
        "host": args.endpoint,
        "namespace": args.namespace,
        "existing_token": token,
        "cookies": cookies,
        "kube_context": None if args.endpoint else args.kube_context,
        "ssl_ca_cert": args.ca_cert,
    }
    result = _send(request, Path(args.spec), client_args)
    print(
        f"fullthrottle: submitted {request['kind']} {request['name']!r} to {request['endpoint']}: "
        f"{result}"
    )
    return exit_status.SUCCESS


def _send(request: dict[str, Any], package: Path, client_args: dict[str, Any]) -> str:
    import kfp
    import kfp_server_api
    import urllib3

    endpoint = request["endpoint"]
    try:
        client = kfp.Client(**client_args)
        if request["cron"] is None:
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments={},
                run_name=request["name"],
                experiment_name=request["experiment"],
                namespace=request["namespace"],
                pipeline_root=request["pipeline_root"],
            )
            return f"run id {result.run_id}"
        experiment = client.create_experiment(request["experiment"], namespace=request["namespace"])
        recurring = client.create_recurring_run(
            experiment_id=experiment.experiment_id,
            job_name=request["name"],
            cron_expression=request["cron"],
            pipeline_package_path=str(package),
            pipeline_root=request["pipeline_root"],
            max_concurrency=1,
            no_catchup=True,
        )
        return f"recurring run id {recurring.recurring_run_id}, cron {request['cron']!r}"
    except kfp_server_api.ApiException as exc:
        raise SubmitError(
            f"Kubeflow Pipelines at {endpoint} refused the {request['kind']}: HTTP {exc.status} {exc.reason}: "
            f"{(exc.body or '')[:500]}"
        ) from None
    except urllib3.exceptions.HTTPError as exc:
        raise SubmitError(
            f"lost the connection to Kubeflow Pipelines at {endpoint}: {exc}"
        ) from None
