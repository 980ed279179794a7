"""The GPU decisions of `trainer_module.training.hardware`, on recorded and composed facts.

No machine here has a GPU or an NVIDIA driver, so what the probes would read on one is given to
the pure functions instead: /proc and /dev listings recorded on a host with Ubuntu's
nvidia-driver-550 (`tests/envrun_listings/`), and NVML answers composed after known machines
(NVLink between pairs as on a DGX-1, NVSwitch as on a DGX A100, PCIe in a workstation). The
probes themselves run for real in `test_gpu_environment.py` (no driver: they say so).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer_module.training import hardware
from trainer_module.training.hardware import (
    GpuEnvironment,
    NvmlFacts,
    NvmlGpu,
    TensorFlowGpu,
    gpu_links,
    interconnect_summary,
    kernel_support,
    no_gpu_reason,
)

LISTINGS = Path(__file__).parent / "envrun_listings"
# TensorFlow 2.21's Linux wheel (`tf.sysconfig.get_build_info()["cuda_compute_capabilities"]`).
TF_2_21_CAPABILITIES = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
NO_LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"

# A machine whose driver, devices and libraries are all in place (the reason is then further on).
WORKING = GpuEnvironment(
    is_cuda_build=True,
    cuda_version="12.5.1",
    cuda_visible_devices=None,
    kernel_driver="550.54.15",
    device_nodes=("/dev/nvidia0", "/dev/nvidia1"),
    libcuda_error=None,
)
NO_DRIVER = dataclasses.replace(
    WORKING, kernel_driver=None, device_nodes=(), libcuda_error=NO_LIBCUDA
)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"is_cuda_build": False}, ["not a CUDA build", "tensorflow[and-cuda]"]),
        ({"cuda_visible_devices": ""}, ["CUDA_VISIBLE_DEVICES='' hides every GPU", "unset it"]),
        ({"cuda_visible_devices": "-1"}, ["CUDA_VISIBLE_DEVICES='-1' hides every GPU"]),
        # These machines: nothing of a driver at all.
        (
            {"kernel_driver": None, "device_nodes": (), "libcuda_error": NO_LIBCUDA},
            ["no NVIDIA driver (libcuda.so.1 cannot be loaded)"],
        ),
        # The host's driver is loaded (/proc shows it) but nothing of it reached this chroot or
        # container: the GPU is not visible in the environment.
        (
            {"device_nodes": (), "libcuda_error": NO_LIBCUDA},
            [
                "driver 550.54.15 is loaded on this machine",
                "not handed",
                "--gpus all",
                "bin/envrun",
            ],
        ),
        ({"device_nodes": ()}, ["no GPU device node (/dev/nvidia0) in this environment"]),
        (
            {"kernel_driver": None, "device_nodes": ()},
            ["library loads but there is no GPU device node", "no NVIDIA kernel module"],
        ),
        (
            {"libcuda_error": NO_LIBCUDA},
            [
                "/dev/nvidia0 /dev/nvidia1 exist but the driver's libcuda.so.1 cannot be loaded",
                "No such file",
                "ldconfig -p",
            ],
        ),  # fmt: skip
        (
            {"kernel_driver": "470.82.01"},
            ["driver 470.82.01 is older than 525.60", "CUDA 12.5.1", "update the driver"],
        ),
        (
            {"missing_cuda_libraries": ("libcudnn.so.9", "libcublasLt.so.12")},
            [
                "CUDA libraries do not load (libcudnn.so.9, libcublasLt.so.12)",
                "tensorflow[and-cuda]",
            ],
        ),
        ({}, ["driver loads and /dev/nvidia0 /dev/nvidia1 exist", "fullthrottle doctor"]),
    ],
)
def test_the_reason_tensorflow_sees_no_gpu_names_the_first_missing_piece(change, says):
    reason = no_gpu_reason(dataclasses.replace(WORKING, **change))
    for phrase in says:
        assert phrase in reason, reason


def test_the_most_basic_cause_wins():
    # A hidden GPU on a machine without a driver: the variable is what the user set, so first.
    both = dataclasses.replace(NO_DRIVER, cuda_visible_devices="-1")
    assert no_gpu_reason(both).startswith("CUDA_VISIBLE_DEVICES='-1'")
    # A driver too old and missing libraries: the driver first (the libraries need it).
    old = dataclasses.replace(
        WORKING, kernel_driver="470.82.01", missing_cuda_libraries=("libcudnn.so.9",)
    )
    assert "older than 525.60" in no_gpu_reason(old)
    assert not NO_DRIVER.driver_present and WORKING.driver_present
    assert dataclasses.replace(NO_DRIVER, kernel_driver="550.54.15").driver_present


def test_the_environment_is_read_from_proc_and_dev(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in (LISTINGS / "ubuntu-driver-550.dev").read_text().split():
        (dev / name).touch()
    env = hardware.gpu_environment(
        libraries=[
            hardware.CudaLibrary("libcudart.so.12", "/x/libcudart.so.12", "12.9", None),
            hardware.CudaLibrary("libcudnn.so.9", None, None, "libcudnn.so.9: cannot open"),
        ],
        proc_driver_version=str(LISTINGS / "ubuntu-driver-550.version"),
        dev_dir=str(dev),
    )
    assert env.kernel_driver == "550.54.15"
    # GPU nodes only (not nvidiactl, nvidia-uvm, nvidia-caps), in the driver's order.
    assert env.device_nodes == tuple(str(dev / f"nvidia{i}") for i in (0, 1, 2, 10))
    assert env.missing_cuda_libraries == ("libcudnn.so.9",)
    assert env.libcuda_error is not None  # the real loader: no libcuda.so.1 on these machines
    empty = hardware.gpu_environment(
        proc_driver_version=str(tmp_path / "absent"), dev_dir=str(tmp_path / "absent")
    )
    assert empty.kernel_driver is None and empty.device_nodes == ()


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ((LISTINGS / "ubuntu-driver-550.version").read_text(), "550.54.15"),
        # The open kernel module's line (composed after NVIDIA's 570 series format).
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:41:50 UTC 2025\nGCC version:  gcc 12\n",
            "570.86.15",
        ),
        ("", None),
        ("GCC version:  gcc version 12.3.0\n", None),
    ],
)
def test_the_kernel_module_version_is_read_from_proc(text, version):
    assert hardware.kernel_driver_version(text) == version


@pytest.mark.parametrize(
    ("capability", "support"),
    [
        ((6, 1), "native"),  # P40: sm_60 code runs on 6.x
        ((7, 0), "native"),  # V100
        ((7, 5), "native"),  # T4: sm_70 code
        ((8, 6), "native"),  # A10: sm_80 code
        ((8, 9), "native"),  # L4
        ((9, 0), "ptx"),  # H100: only compute_90 PTX in this build, compiled at first start
        ((10, 0), "ptx"),  # B200
        ((5, 2), "none"),  # M60: below every kernel of the build, TensorFlow ignores it
    ],
)
def test_kernel_support_follows_the_build_s_capability_list(capability, support):
    assert kernel_support(capability, TF_2_21_CAPABILITIES) == support


def test_the_lowest_capability_of_a_build():
    assert hardware.lowest_capability(TF_2_21_CAPABILITIES) == (6, 0)
    assert hardware.lowest_capability(["compute_90"]) == (9, 0)
    assert hardware.lowest_capability([]) is None


def test_driver_cuda_levels():
    assert hardware.cuda_level(12040) == "12.4" and hardware.cuda_level(13000) == "13.0"
    assert hardware.cuda_level_below("12.2", "12.5.1")
    assert not hardware.cuda_level_below("12.5", "12.5.1")
    assert not hardware.cuda_level_below("13.0", "12.5.1")
    assert not hardware.cuda_level_below(None, "12.5.1")
    assert not hardware.cuda_level_below("garbled", "12.5.1")


def _gpu(index, bus, *, peers=(), switch_links=0, capability=(8, 0)):
    return NvmlGpu(
        index=index,
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        compute_capability=capability,
        pci_bus_id=bus,
        nvlink_peers=tuple(peers),
        nvswitch_links=switch_links,
    )


def test_direct_nvlinks_are_counted_per_pair_and_other_pairs_take_their_pcie_path():
    # After a DGX-1: GPU 0 has two NVLinks to GPU 1 and one to GPU 2; GPUs 2 and 3 sit on the
    # other CPU socket; NVML gives the remote address in its 8-digit-domain form.
    buses = ["00000000:06:00.0", "00000000:07:00.0", "00000000:85:00.0", "00000000:86:00.0"]
    nvml = NvmlFacts(
        error=None,
        driver_version="550.54.15",
        cuda_level="12.4",
        gpus=(
            _gpu(0, buses[0], peers=["00000000:07:00.0", "00000000:07:00.0", "0000:85:00.0"]),
            _gpu(1, buses[1], peers=[buses[0], buses[0]]),
            _gpu(2, buses[2], peers=[buses[0]]),
            _gpu(3, buses[3]),
        ),
        topology=((0, 1, 10), (0, 2, 50), (0, 3, 50), (1, 2, 50), (1, 3, 50), (2, 3, 20)),
    )
    links = {link.gpus: link for link in gpu_links(nvml)}
    assert (links[(0, 1)].kind, links[(0, 1)].label) == ("NVLink", "NV2")
    assert (links[(0, 2)].kind, links[(0, 2)].label) == ("NVLink", "NV1")  # 4-digit domain too
    assert (links[(0, 3)].kind, links[(0, 3)].label) == ("PCIe", "SYS")
    assert links[(0, 3)].detail == "PCIe across CPU sockets (QPI/UPI)"
    assert (links[(2, 3)].kind, links[(2, 3)].label) == ("PCIe", "PXB")
    summary = interconnect_summary(list(links.values()))
    assert summary["kind"] == "mixed"
    assert summary["detail"] == (
        "2 NVLinks (1 pair), 1 NVLink (1 pair), PCIe across CPU sockets (QPI/UPI) (3 pairs), "
        "PCIe through several PCIe switches (1 pair)"
    )
    assert {"gpus": [0, 1], "kind": "NVLink", "label": "NV2"} in summary["pairs"]


def test_gpus_on_nvswitches_are_all_nvlinked():
    # After a DGX A100: every GPU's 12 NVLinks go to NVSwitches, none to another GPU.
    gpus = tuple(_gpu(i, f"00000000:{0x07 + i:02x}:00.0", switch_links=12) for i in range(4))
    topology = tuple((a, b, 40) for a in range(4) for b in range(a + 1, 4))
    links = gpu_links(NvmlFacts(error=None, gpus=gpus, topology=topology))
    assert len(links) == 6 and {(link.kind, link.label) for link in links} == {
        ("NVLink", "NVSwitch")
    }
    assert interconnect_summary(links)["kind"] == "NVLink"


def test_pcie_only_gpus_and_a_single_gpu():
    gpus = (_gpu(0, "00000000:01:00.0"), _gpu(1, "00000000:02:00.0"))
    links = gpu_links(NvmlFacts(error=None, gpus=gpus, topology=((0, 1, 30),)))
    assert [(link.kind, link.label) for link in links] == [("PCIe", "PHB")]
    assert interconnect_summary(links) == {
        "kind": "PCIe",
        "detail": "PCIe through a CPU's PCIe host bridge (1 pair)",
        "pairs": [{"gpus": [0, 1], "kind": "PCIe", "label": "PHB"}],
    }
    one = NvmlFacts(error=None, gpus=gpus[:1])
    assert gpu_links(one) == [] and interconnect_summary([]) is None


def test_the_device_line_names_the_gpus_or_why_there_are_none():
    a100 = TensorFlowGpu("/physical_device:GPU:0", "NVIDIA A100-SXM4-40GB", (8, 0))
    second = dataclasses.replace(a100, name="/physical_device:GPU:1")
    assert (
        hardware.device_summary([a100, second]) == "TensorFlow sees 2 GPUs (NVIDIA A100-SXM4-40GB)"
    )
    assert hardware.device_summary([a100]) == "TensorFlow sees 1 GPU (NVIDIA A100-SXM4-40GB)"
    line = hardware.device_summary([], logical_cpus=2, reason=no_gpu_reason(NO_DRIVER))
    assert line == (
        "training on the CPU (2 logical devices): TensorFlow sees no GPU, "
        "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    )


def test_driver_age_check_follows_the_cuda_major_version():
    assert hardware.driver_too_old("470.82.01", "12.5.1") == "525.60"
    assert hardware.driver_too_old("535.104.05", "12.5.1") is None
    assert hardware.driver_too_old("535.104.05", "13.0") == "580.0"
    assert hardware.driver_too_old("garbled", "12.5.1") is None
