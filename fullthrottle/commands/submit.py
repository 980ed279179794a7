"""`fullthrottle submit SPEC`: send a compiled spec to Kubeflow Pipelines, once or on a schedule.

The endpoint is checked first with one short request (`/apis/v2beta1/healthz`), so an unreachable
or refusing endpoint is reported in seconds, by name, before `kfp.Client` (whose own start-up
retries for much longer) is involved. `--dry-run` prints what would be sent and contacts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import ConfigError, FullthrottleError

HEALTHZ = "/apis/v2beta1/healthz"
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
            "endpoint with kfp.Client: one run, or with --schedule a recurring run. "
            "--dry-run prints what would be sent without contacting anything."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle submit fullthrottle-kubeflow.json --endpoint http://127.0.0.1:8080\n"
            "  fullthrottle submit spec.json --endpoint http://kfp --schedule '0 0 3 * * *'\n"
            "  fullthrottle submit spec.json --endpoint http://kfp --dry-run"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", metavar="SPEC", help="the compiled pipeline JSON")
    parser.add_argument(
        "--endpoint", help=f"KFP API URL, e.g. http://127.0.0.1:8080 (default: ${ENDPOINT_ENV})"
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


def read_spec(path: Path) -> dict[str, Any]:
    """The compiled PipelineJob dict; refuses anything that is not one, naming the file."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    if not path.is_file():
        raise ConfigError(
            f"spec {path} does not exist; write one with `fullthrottle compile --target kubeflow -o {path}`"
        )
    try:
        job = json.loads(path.read_text(encoding="utf-8"))
        spec = job["pipelineSpec"]
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    except (ValueError, KeyError, TypeError, json_format.ParseError) as exc:
        raise ConfigError(
            f"{path} is not a compiled KFP pipeline spec ({type(exc).__name__}: {exc}); "
            "write one with `fullthrottle compile --target kubeflow`"
        ) from None
    return job


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


def plan(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Everything the request will carry, decided before any connection."""
    spec = job["pipelineSpec"]
    pipeline_name = spec.get("pipelineInfo", {}).get("name", "pipeline")
    images = sorted(
        {
            e["container"]["image"]
            for e in spec.get("deploymentSpec", {}).get("executors", {}).values()
            if "container" in e
        }
    )
    return {
        "endpoint": args.endpoint,
        "namespace": args.namespace,
        "experiment": args.experiment,
        "kind": "recurring run" if args.schedule else "run",
        "name": args.run_name or pipeline_name,
        "cron": kfp_cron(args.schedule) if args.schedule else None,
        "pipeline": pipeline_name,
        "pipeline_root": job.get("runtimeConfig", {}).get("gcsOutputDirectory"),
        "images": images,
        "spec_file": args.spec,
    }


def check_endpoint(endpoint: str) -> None:
    """One short GET of KFP's health check; raises SubmitError naming the endpoint."""
    import urllib3

    url = endpoint.rstrip("/") + HEALTHZ
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS), retries=False
    )
    try:
        response = http.request("GET", url)
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SubmitError(
            f"cannot reach Kubeflow Pipelines at {endpoint} ({reason}). Check --endpoint: the KFP API "
            "or UI service, e.g. after `kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80` "
            "use http://127.0.0.1:8080"
        ) from None
    if response.status != 200:
        raise SubmitError(
            f"Kubeflow Pipelines at {endpoint} refused: GET {HEALTHZ} answered HTTP {response.status}. "
            "Is this a KFP v2 API endpoint (and does it need authentication)?"
        )


def run(args: argparse.Namespace) -> int:
    job = read_spec(Path(args.spec))
    args.endpoint = args.endpoint or os.environ.get(ENDPOINT_ENV)
    if not args.endpoint:
        raise ConfigError(
            f"no KFP endpoint: pass --endpoint http://<host>:<port> or set ${ENDPOINT_ENV}"
        )
    if "://" not in args.endpoint:
        raise ConfigError(
            f"--endpoint {args.endpoint!r} must be a URL such as http://127.0.0.1:8080"
        )
    request = plan(args, job)
    if args.dry_run:
        print("fullthrottle submit --dry-run: would send (nothing was contacted):")
        print(json.dumps(request, indent=2))
        return exit_status.SUCCESS
    check_endpoint(args.endpoint)
    result = _send(request, job)
    print(
        f"fullthrottle: submitted {request['kind']} {request['name']!r} to {args.endpoint}: {result}"
    )
    return exit_status.SUCCESS


def _send(request: dict[str, Any], job: dict[str, Any]) -> str:
    import kfp
    import kfp_server_api
    import urllib3
    import yaml

    endpoint = request["endpoint"]
    with tempfile.TemporaryDirectory(prefix="fullthrottle-submit-") as tmp:
        # kfp.Client takes the pipeline spec as IR YAML (the PipelineJob's pipelineSpec).
        package = Path(tmp) / "pipeline.yaml"
        package.write_text(yaml.safe_dump(job["pipelineSpec"], sort_keys=True), encoding="utf-8")
        try:
            client = kfp.Client(host=endpoint, namespace=request["namespace"])
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
            experiment = client.create_experiment(
                request["experiment"], namespace=request["namespace"]
            )
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
