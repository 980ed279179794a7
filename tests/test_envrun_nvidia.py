"""bin/envrun-nvidia's decisions: what of a host's NVIDIA driver bin/envrun hands to the
environment, decided on loader-cache (`ldconfig -p`) and /dev listings.

tests/envrun_listings/ holds `ci-host.*`, recorded on the 2-core CI machine (a CUDA 13 toolkit
in the loader cache, no driver, no GPU), and `ubuntu-driver-550.*`, composed after what
Ubuntu's nvidia-driver-550 packages install (no machine here has a GPU to record one from).
The mounting itself is checked on the host by tests/host/check_envrun.sh.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "bin" / "envrun-nvidia"
LISTINGS = REPO / "tests" / "envrun_listings"
DRIVER_LDCONFIG = LISTINGS / "ubuntu-driver-550.ldconfig"
DRIVER_DEV = LISTINGS / "ubuntu-driver-550.dev"
DRIVER_VERSION = LISTINGS / "ubuntu-driver-550.version"
HOST_LDCONFIG = LISTINGS / "ci-host.ldconfig"
HOST_DEV = LISTINGS / "ci-host.dev"


def plan(
    ldconfig: Path,
    dev: Path,
    version: Path | None = DRIVER_VERSION,
    *,
    ld_library_path: str = "",
) -> list[tuple[str, ...]]:
    args = ["bash", str(PLAN), "plan", "--ldconfig", str(ldconfig), "--dev", str(dev)]
    args += ["--version", str(version or "/nonexistent")]
    args += ["--ld-library-path", ld_library_path]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return [tuple(line.split("\t")) for line in done.stdout.splitlines()]


def libs(decisions: list[tuple[str, ...]]) -> dict[str, str]:
    return {d[1]: d[2] for d in decisions if d[0] == "lib"}


def notes(decisions: list[tuple[str, ...]]) -> list[str]:
    return [d[1] for d in decisions if d[0] == "note"]


def test_the_recorded_ci_host_has_no_driver_so_nothing_is_decided():
    # Its loader cache lists a CUDA toolkit's libcudart: that is not a driver.
    assert "libcudart.so" in HOST_LDCONFIG.read_text()
    assert plan(HOST_LDCONFIG, HOST_DEV, version=None) == []


def test_a_driver_host_hands_over_its_devices_driver_libraries_and_tools():
    decisions = plan(DRIVER_LDCONFIG, DRIVER_DEV)
    assert ("driver", "550.54.15") in decisions
    assert [d[1] for d in decisions if d[0] == "gpu"] == [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia2",
        "/dev/nvidia10",
    ]
    assert {d[1] for d in decisions if d[0] == "dev"} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert libs(decisions) == {
        "libcuda.so.1": "/lib/x86_64-linux-gnu/libcuda.so.1",
        "libcuda.so": "/lib/x86_64-linux-gnu/libcuda.so",
        "libcudadebugger.so.1": "/lib/x86_64-linux-gnu/libcudadebugger.so.1",
        "libnvidia-ml.so.1": "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "libnvidia-ml.so": "/lib/x86_64-linux-gnu/libnvidia-ml.so",
        "libnvidia-ptxjitcompiler.so.1": "/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
        "libnvidia-ptxjitcompiler.so": "/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so",
        "libnvidia-nvvm.so.4": "/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4",
        "libnvidia-nvvm.so": "/lib/x86_64-linux-gnu/libnvidia-nvvm.so",
        "libnvidia-gpucomp.so.550.54.15": "/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.550.54.15",
        "libnvidia-opencl.so.1": "/lib/x86_64-linux-gnu/libnvidia-opencl.so.1",
        "libnvidia-cfg.so.1": "/lib/x86_64-linux-gnu/libnvidia-cfg.so.1",
        "libnvidia-cfg.so": "/lib/x86_64-linux-gnu/libnvidia-cfg.so",
        "libnvidia-allocator.so.1": "/lib/x86_64-linux-gnu/libnvidia-allocator.so.1",
        "libnvidia-allocator.so": "/lib/x86_64-linux-gnu/libnvidia-allocator.so",
        "libnvidia-pkcs11.so.550.54.15": "/lib/x86_64-linux-gnu/libnvidia-pkcs11.so.550.54.15",
        "libnvidia-pkcs11-openssl3.so.550.54.15": (
            "/lib/x86_64-linux-gnu/libnvidia-pkcs11-openssl3.so.550.54.15"
        ),
    }
    assert "nvidia-smi" in {d[1] for d in decisions if d[0] == "bin"}
    assert notes(decisions) == []


def test_never_the_toolkit_graphics_or_32_bit_libraries():
    handed = libs(plan(DRIVER_LDCONFIG, DRIVER_DEV))
    # The CUDA runtime, cuBLAS, NVRTC... come from the environment's wheels in the versions
    # TensorFlow was built against; a host toolkit's copies would shadow them.
    for name in ("libcudart.so.12", "libcublas.so.12", "libnvrtc.so.12", "libnvJitLink.so.12"):
        assert name not in handed
    for name in ("libnvidia-glcore.so.550.54.15", "libGLX_nvidia.so.0", "libnvidia-encode.so.1"):
        assert name not in handed
    assert not [path for path in handed.values() if "i386" in path]


def test_an_old_driver_s_leftovers_are_left_out_when_the_running_version_is_known():
    with_version = libs(plan(DRIVER_LDCONFIG, DRIVER_DEV))
    assert "libnvidia-gpucomp.so.535.104.05" not in with_version
    # Without /proc/driver/nvidia/version nothing tells them apart: both names are handed over
    # (they cannot collide: each keeps its own name).
    without = libs(plan(DRIVER_LDCONFIG, DRIVER_DEV, version=None))
    assert {"libnvidia-gpucomp.so.535.104.05", "libnvidia-gpucomp.so.550.54.15"} <= set(without)


def test_driver_libraries_without_a_gpu_device_are_reported_not_handed_over():
    decisions = plan(DRIVER_LDCONFIG, HOST_DEV)
    assert libs(decisions) == {} and not [d for d in decisions if d[0] == "gpu"]
    (note,) = notes(decisions)
    assert "no GPU device node (/dev/nvidia0)" in note and "kernel module" in note


def test_gpu_devices_without_driver_libraries_say_what_is_missing():
    decisions = plan(HOST_LDCONFIG, DRIVER_DEV)
    assert libs(decisions) == {}
    (note,) = notes(decisions)
    assert "/dev/nvidia0" in note and "libcuda.so.1" in note and "ldconfig" in note


def test_a_missing_nvidia_uvm_node_is_reported():
    dev = LISTINGS / "driver-without-uvm.dev"
    decisions = plan(DRIVER_LDCONFIG, dev)
    assert "libcuda.so.1" in libs(decisions)
    assert any("/dev/nvidia-uvm" in note and "nvidia-modprobe" in note for note in notes(decisions))


def test_ld_library_path_comes_before_the_loader_cache(tmp_path):
    # Where GKE's driver installer (and an enclosing envrun) put the driver: the loader searches
    # LD_LIBRARY_PATH before its cache, so the plan does too.
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libcudart.so.12"):
        (tmp_path / name).write_bytes(b"")
    decisions = plan(HOST_LDCONFIG, DRIVER_DEV, ld_library_path=f"/nonexistent:{tmp_path}")
    assert libs(decisions) == {
        "libcuda.so.1": str(tmp_path / "libcuda.so.1"),
        "libnvidia-ml.so.1": str(tmp_path / "libnvidia-ml.so.1"),
    }
    shadowed = plan(DRIVER_LDCONFIG, DRIVER_DEV, ld_library_path=str(tmp_path))
    assert libs(shadowed)["libcuda.so.1"] == str(tmp_path / "libcuda.so.1")


@pytest.mark.parametrize("bad", [["plan", "--unknown", "x"], ["explain"], []])
def test_bad_usage_is_refused(bad):
    done = subprocess.run(["bash", str(PLAN), *bad], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "usage:" in done.stderr
