"""Hardware and software facts for the report, with what torch knows (CUDA, cuDNN, the GPU):
why is today's number different? (docs/ARCHITECTURE.md, the method).

``system_info(device)`` runs on the training thread at run start and goes into the run_started
event, so a report made later, on another machine, still describes the machine that trained.
``host_info()`` never imports torch: the report falls back to it for runs recorded without it.
"""

from __future__ import annotations

from typing import Any

from probes.counters.host import host_info


def system_info(device: Any = None) -> dict[str, Any]:
    """host_info plus what torch knows: CUDA/cuDNN versions and the GPU, when ``device`` is one.

    Call it on the training thread (it may initialise CUDA); it never raises.
    """
    info = host_info()
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        info["cudnn"] = (torch.backends.cudnn.version()
                         if torch.backends.cudnn.is_available() else None)
        info["num_threads"] = torch.get_num_threads()
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(dev)
            info["gpu_name"] = props.name
            info["gpu_uuid"] = gpu_uuid(props)
            info["gpu_memory_bytes"] = int(props.total_memory)
            info["gpu_capability"] = f"{props.major}.{props.minor}"
            info["gpu_count"] = torch.cuda.device_count()
    except Exception as exc:  # a report field is never worth a failed run
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    info["source"] = "run start"
    return info


def gpu_uuid(props: Any) -> str | None:
    """NVIDIA's id of the device as NVML and nvidia-smi write it ("GPU-" and the UUID): the
    label dcgm-exporter and nvitop-exporter put on their series, so a query can join memtop's
    to theirs (probes/export). torch gives the bare UUID (``props.uuid``); None without one."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
