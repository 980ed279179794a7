"""`fullthrottle doctor` on this machine: versions, CPU bf16 support, what `auto` picks, pitfalls."""

from __future__ import annotations

import importlib.metadata
import json
import platform

import tensorflow as tf

from fullthrottle.commands.doctor import cpu_facts
from tests.helpers import run_cli


def _cpuinfo_flags() -> set[str]:
    # Read independently of the code under test.
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_doctor_reports_versions_bf16_and_the_auto_choices_of_this_machine():
    result = run_cli("doctor", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    versions = report["versions"]
    assert versions["Python"] == platform.python_version()
    assert versions["TensorFlow"] == tf.__version__
    for name, dist in (("TFX", "tfx"), ("Apache Beam", "apache-beam"), ("MLflow", "mlflow")):
        assert versions[name] == importlib.metadata.version(dist)

    flags = _cpuinfo_flags()
    native = bool(flags & {"avx512_bf16", "amx_bf16"})
    cpu = report["cpu"]
    assert cpu["native_bf16"] is native
    assert cpu["flags"]["avx512_bf16"] is ("avx512_bf16" in flags)
    assert cpu["flags"]["amx_bf16"] is ("amx_bf16" in flags)
    assert cpu["amx"] is ("amx_tile" in flags)
    if not tf.config.list_physical_devices("GPU"):
        # No GPU: auto trains in bf16 exactly when the CPU has it natively.
        assert report["auto"]["precision"] == ("mixed_bfloat16" if native else "float32")
        assert report["auto"]["strategy"] == "OneDeviceStrategy"
    assert report["tensorflow"]["cuda_version"] == tf.sysconfig.get_build_info().get("cuda_version")


def test_doctor_text_says_this_cpu_has_native_bf16():
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    if "avx512_bf16" in _cpuinfo_flags():  # the CI machines (AMD EPYC) have it
        assert "native bf16    yes (AVX512_BF16)" in text
        assert "AVX512_BF16" in text.split("features", 1)[1].splitlines()[0]
    else:
        assert "native bf16    no" in text
    assert "What `auto` picks here" in text and "precision" in text


def test_doctor_resolves_auto_for_the_given_config_and_warns_about_pitfalls():
    result = run_cli(
        "doctor",
        "--json",
        "--set",
        "training.precision=mixed_bfloat16",
        env={"TF_ENABLE_ONEDNN_OPTS": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["auto"]["precision"] == "mixed_bfloat16"
    assert "set in config" in report["auto"]["precision_reason"]
    assert any("TF_ENABLE_ONEDNN_OPTS=0" in w for w in report["warnings"])


def test_doctor_rejects_a_bad_override_with_a_message():
    result = run_cli("doctor", "--set", "training.precision=fp8")
    assert result.returncode == 2
    assert "training.precision" in result.stderr and "Traceback" not in result.stderr


def test_cpu_without_bf16_flags_is_reported_as_no_native_bf16(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Old Xeon\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n\n"
    )
    facts = cpu_facts(str(cpuinfo))
    assert facts["model"] == "Old Xeon"
    assert facts["native_bf16"] is False and facts["flags"]["avx512f"] is True
    cpuinfo.write_text(
        "model name\t: Sapphire Rapids\nflags\t\t: avx512f avx512_bf16 amx_tile amx_bf16\n"
    )
    facts = cpu_facts(str(cpuinfo))
    assert facts["native_bf16"] is True and facts["native_bf16_flags"] == [
        "avx512_bf16",
        "amx_bf16",
    ]
    assert facts["amx"] is True
