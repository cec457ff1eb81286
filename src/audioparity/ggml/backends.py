"""The ggml backends this ggml-python can run: which are built in, their devices and what they
report of them (:func:`doctor`), one backend device started (:func:`init_backend`), the build
every dump records (:func:`build_info`) and the memory a backend has free.

:class:`~audioparity.ggml.runtime.Runtime` starts its backend here; a backend that is not built
into this ggml-python, or has no such device, raises :class:`BackendUnavailable`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import tempfile

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import BACKENDS
from audioparity.dumping.memory import host_free_bytes
from audioparity.ggml.bindings import ggml

# ggml backend registry names of the backends this project drives.
_REGISTRY_NAMES = {"cpu": b"CPU", "cuda": b"CUDA", "vulkan": b"Vulkan"}
_BUILT_IN_FLAGS = {"cuda": "GGML_USE_CUDA", "vulkan": "GGML_USE_VULKAN"}


class BackendUnavailable(AudioparityError):
    """The requested backend is not built into this ggml-python, or has no such device."""


#: A device line ggml-vulkan prints when it starts: ``ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6,
#: 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | warp size: 8 | ...``.
_VULKAN_DEVICE = re.compile(r"^ggml_vulkan: (\d+) = (.*) \(([^()]*)\) \| (.*)$")
#: A device line ggml-cuda prints when it starts (ggml-cuda.cu, ``ggml_cuda_init``): ``Device
#: 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143167 MiB``.
_CUDA_DEVICE = re.compile(r"^Device (\d+): (.*), compute capability (\d+\.\d+), (.*)$")
#: Environment variables of the ggml backends (GGML_VK_DISABLE_F16, GGML_CUDA_FORCE_MMQ, ...),
#: recorded in every dump's manifest (``backend_env``): they change what a backend computes.
_BACKEND_ENV = re.compile(r"^GGML_(VK|VULKAN|CUDA|SCHED)_")


@functools.cache
def device_properties() -> dict[str, dict[str, str]]:
    """What the backends report of their devices as ggml starts them, by ggml device name
    (:func:`parse_device_lines`). The backends print them to stderr at their first use, so
    that first use happens here with stderr read (and written back: the lines still reach a
    log)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            ggml.ggml_backend_dev_count()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    sys.stderr.write(text)
    return parse_device_lines(text)


def parse_device_lines(text: str) -> dict[str, dict[str, str]]:
    """The devices ggml's backends describe in ``text`` (what they print as they start), by
    ggml device name: ``Vulkan0``: the name, the driver, and the features ggml-vulkan uses
    (``fp16``, ``bf16``, ``warp size`` (the subgroup size), ``shared memory``, ``int dot``,
    ``matrix cores``); ``CUDA0``: the name, the ``compute capability`` (``9.0``; what
    ggml-cuda picks its kernels by, :mod:`audioparity.ggml.cuda`), ``VMM``, ``VRAM``."""
    found = {}
    for line in text.splitlines():
        match = _VULKAN_DEVICE.match(line.strip())
        if match:
            fields = dict(part.split(": ", 1) for part in match.group(4).split(" | ")
                          if ": " in part)
            found[f"Vulkan{match.group(1)}"] = {"name": match.group(2), "driver": match.group(3),
                                                **fields}
        match = _CUDA_DEVICE.match(line.strip())
        if match:
            fields = dict(part.split(": ", 1) for part in match.group(4).split(", ")
                          if ": " in part)
            found[f"CUDA{match.group(1)}"] = {"name": match.group(2),
                                              "compute capability": match.group(3), **fields}
    return found


def backend_env() -> dict[str, str]:
    """The ggml backend settings in this process's environment (``GGML_VK_*``, ...)."""
    return {key: value for key, value in sorted(os.environ.items()) if _BACKEND_ENV.match(key)}


#: Why a Vulkan build may list no device on a machine without a GPU.
NO_VULKAN_DEVICE = ("ggml-vulkan lists a CPU driver (lavapipe) only when GGML_VK_VISIBLE_DEVICES "
                    "names it (e.g. GGML_VK_VISIBLE_DEVICES=0)")


def _no_device_hint(backend: str) -> str:
    """``: <why>`` for a backend that lists no device, when the reason is known; else ``""``."""
    unset = "GGML_VK_VISIBLE_DEVICES" not in os.environ
    return f": {NO_VULKAN_DEVICE}" if backend == "vulkan" and unset else ""


def _backend_built_in(backend: str) -> bool:
    flag = _BUILT_IN_FLAGS.get(backend)
    return flag is None or bool(getattr(ggml, flag, False))


def init_backend(backend: str, device: int):
    """Initialise ``backend`` device ``device`` through ggml's backend registry."""
    reg = ggml.ggml_backend_reg_by_name(_REGISTRY_NAMES[backend])
    if not _backend_built_in(backend) or not reg:
        raise BackendUnavailable(
            f"backend {backend!r} is not built into ggml-python {ggml.__version__} "
            f"(rebuild with CMAKE_ARGS=-DGGML_{backend.upper()}=ON)"
        )
    count = ggml.ggml_backend_reg_dev_count(reg)
    if not 0 <= device < count:
        hint = _no_device_hint(backend) if count == 0 else ""
        raise BackendUnavailable(f"backend {backend!r} has {count} device(s); no device "
                                 f"{device}{hint}")
    handle = ggml.ggml_backend_dev_init(ggml.ggml_backend_reg_dev_get(reg, device), None)
    if not handle:
        raise BackendUnavailable(f"backend {backend!r} device {device} failed to initialise")
    return handle


def _dev_type_name(dev_type: int) -> str:
    return {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}.get(dev_type, str(dev_type))


def doctor() -> dict:
    """What this ggml-python can run: versions, backends built in, devices, CPU features.

    Returns a JSON-serialisable dict: ``ggml_python`` and ``ggml`` versions, ``backends``
    (name -> built in), ``devices`` (registry name, device name, description, type, memory,
    and what the backend reports of it: for Vulkan the driver, fp16, the subgroup size, ...),
    ``backend_env`` (:func:`backend_env`) and ``cpu_features`` (ggml_cpu_has_* that are set).
    """
    properties = device_properties()
    devices = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append({
            "registry": ggml.ggml_backend_reg_name(ggml.ggml_backend_dev_backend_reg(dev)).decode(),
            "name": ggml.ggml_backend_dev_name(dev).decode(),
            "description": ggml.ggml_backend_dev_description(dev).decode(),
            "type": _dev_type_name(ggml.ggml_backend_dev_type(dev)),
            "memory_total_bytes": int(total.value),
            **({"properties": properties[name]} if (name := ggml.ggml_backend_dev_name(
                dev).decode()) in properties else {}),
        })
    registries = {ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
                  for i in range(ggml.ggml_backend_reg_count())}
    return {
        "ggml_python": ggml.__version__,
        "ggml": ggml.GGML_VERSION,
        "backends": {
            b: _backend_built_in(b) and _REGISTRY_NAMES[b].decode() in registries
            for b in BACKENDS
        },
        "registries": sorted(registries),
        "devices": devices,
        "backend_env": backend_env(),
        "notes": _doctor_notes(registries, devices),
        **build_info(),
    }


def check_backend(backend: str, report: dict | None = None) -> str:
    """One line naming the device ``backend`` runs on (its first, as the workflow's cells do).

    Raises:
        BackendUnavailable: the backend is not built in, or lists no device (with
            :func:`doctor`'s note on why).
    """
    report = report or doctor()
    if not report["backends"][backend]:
        raise BackendUnavailable(f"backend {backend!r} is not built into ggml-python "
                                 f"{report['ggml_python']} (make setup-{backend})")
    registry = _REGISTRY_NAMES[backend].decode()
    devices = [d for d in report["devices"] if d["registry"] == registry]
    if not devices:
        raise BackendUnavailable(f"backend {backend!r} lists no device"
                                 f"{_no_device_hint(backend)}")
    device = devices[0]
    features = ", ".join(f"{k} {v}" for k, v in device.get("properties", {}).items()
                         if k != "name")
    return f"{backend}: device 0 of {len(devices)} is {device['description']}" + (
        f" ({features})" if features else "")


def _doctor_notes(registries: set[str], devices: list[dict]) -> list[str]:
    """What a reader of :func:`doctor` should know: a Vulkan build that lists no device."""
    if "Vulkan" in registries and not any(d["registry"] == "Vulkan" for d in devices):
        return [f"Vulkan is built in but lists no device{_no_device_hint('vulkan')}"]
    return []


#: CPU kernels a patch of ``setup/patches/`` adds, by the feature name the patched CPU backend
#: reports for it (``ggml_backend_get_features``) -> the name :func:`build_info` lists.
PATCHED_KERNELS = {"Q8_0_R8": "q8_0_r8", "F32_R16": "f32_r16"}


class _Feature(ctypes.Structure):
    """``struct ggml_backend_feature`` (ggml-backend.h): a name and its value, both strings."""
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def _cpu_backend_features() -> set[str]:
    """The names ggml's CPU backend reports through its registry's ``ggml_backend_get_features``
    (ggml-cpu.cpp, ``ggml_backend_cpu_get_features``: the list ends with a null name)."""
    registry = ggml.ggml_backend_reg_by_name(_REGISTRY_NAMES["cpu"])
    address = registry and ggml.ggml_backend_reg_get_proc_address(
        registry, b"ggml_backend_get_features")
    if not address:
        return set()
    features = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(address)(registry)
    names, i = set(), 0
    while features[i].name is not None:
        names.add(features[i].name.decode())
        i += 1
    return names


def build_info() -> dict:
    """Which ggml build computes: versions, the ``ggml_cpu_has_*`` features that are set
    (``llamafile`` and ``blas`` change the f16/f32 matmul kernels, hence the numerics) and the
    kernels the project's patches add that this build has (:data:`PATCHED_KERNELS`: they
    change the order of an f32 or q8_0 matmul's float additions). Every ggml dump records it in its
    manifest (``ggml_build``)."""
    reported = _cpu_backend_features()
    features = sorted(
        [name.removeprefix("ggml_cpu_has_")
         for name in dir(ggml)
         if name.startswith("ggml_cpu_has_") and _safe_flag(getattr(ggml, name))]
        + [name for feature, name in PATCHED_KERNELS.items() if feature in reported])
    return {"ggml_python": ggml.__version__, "ggml": ggml.GGML_VERSION, "cpu_features": features}


def _safe_flag(func) -> bool:
    try:
        return bool(func())
    except (RuntimeError, TypeError, AttributeError):
        return False


def free_bytes(handle) -> int | None:
    """Memory free for buffers of backend ``handle``: a CPU's :func:`host_free_bytes`, a
    device's what ``ggml_backend_dev_memory`` reports; None when unknown."""
    device = ggml.ggml_backend_get_device(handle)
    if ggml.ggml_backend_dev_type(device) != ggml.GGML_BACKEND_DEVICE_TYPE_CPU:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        return free.value or None
    return host_free_bytes()
