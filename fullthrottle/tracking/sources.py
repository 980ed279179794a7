"""Where a run comes from: MLflow's standard source tags, and the environment it ran in.

`source_tags` gives the source tags `mlflow.start_run` sets for a local run (`mlflow.user`,
`mlflow.source.name` the program that ran, `mlflow.source.type` LOCAL; MLflow's documented
system tags, set here because the runs are made with `MlflowClient.create_run`) plus the git
state of the code that ran (`mlflow.source.git.commit`, `.branch`, `.repoURL`, and `fullthrottle.git_dirty`), read with
GitPython from this package's checkout, wherever the command was started. Outside a checkout
(an image) there are no git tags. `environment_tags` names package versions and the device.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

from mlflow.utils.mlflow_tags import MLFLOW_GIT_BRANCH, MLFLOW_GIT_COMMIT, MLFLOW_GIT_REPO_URL

from fullthrottle.core.redact import redact_text

PACKAGES = (
    "tensorflow",
    "keras",
    "tfx",
    "apache-beam",
    "mlflow",
    "tensorflow-transform",
    "tensorflow-model-analysis",
)
GIT_DIRTY_TAG = "fullthrottle.git_dirty"
_CODE = Path(__file__).resolve().parents[2]


def git_tags(path: Path = _CODE) -> dict[str, str]:
    """Commit, branch, remote URL and dirty flag of the checkout holding `path`; {} outside git."""
    try:
        import git

        repo = git.Repo(path, search_parent_directories=True)
        tags = {
            MLFLOW_GIT_COMMIT: repo.head.commit.hexsha,
            GIT_DIRTY_TAG: str(repo.is_dirty(untracked_files=False)).lower(),
        }
    except Exception:  # noqa: BLE001 - no git, no checkout, no commit yet: no git tags
        return {}
    if not repo.head.is_detached:
        tags[MLFLOW_GIT_BRANCH] = repo.active_branch.name
    if repo.remotes:
        tags[MLFLOW_GIT_REPO_URL] = redact_text(next(iter(repo.remotes[0].urls), ""))
    return {k: v for k, v in tags.items() if v}


def source_tags() -> dict[str, str]:
    """MLflow's source tags for a run made by this process, and the code's git state."""
    import getpass
    import sys

    from mlflow.entities import SourceType
    from mlflow.utils.mlflow_tags import MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

    tags = {MLFLOW_SOURCE_TYPE: SourceType.to_string(SourceType.LOCAL)}
    program = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if program:
        tags[MLFLOW_SOURCE_NAME] = program
    # No user name in this container (KeyError, OSError): MLflow leaves it unset too.
    with contextlib.suppress(KeyError, OSError):
        tags[MLFLOW_USER] = getpass.getuser()
    tags.update(git_tags())
    return tags


def environment_tags() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    tags = {
        "fullthrottle.python": platform.python_version(),
        "fullthrottle.host_cpu": platform.machine(),
    }
    for package in PACKAGES:
        try:
            tags[f"fullthrottle.version.{package}"] = version(package)
        except PackageNotFoundError:
            continue
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        tags["fullthrottle.device"] = f"{len(gpus)} GPU" if gpus else f"CPU x{os.cpu_count()}"
    except Exception:  # noqa: BLE001 - a tag is not worth failing for
        pass
    return tags
