"""The machine a figure was measured on: CPU model, whether bf16 is native there (or emulated:
each bf16 matmul converted to fp32 and back, ~16× slower), cores, RAM, the GPU, Python and
torch. Every figure needs it: the same command moves ±25% between this project's machines.

``line()`` is the dated log's sentence; ``short()`` RESULTS.md's machine cell
("AMD EPYC 7B13 · bf16 emulated · 2 cores")."""

from __future__ import annotations

import dataclasses
import sys

from probes.counters.host import (
    bf16_emulated_why,
    cpu_bf16_override,
    host_info,
    read_cpu_flags,
)


@dataclasses.dataclass(frozen=True)
class Machine:
    cpu: str
    bf16_native: bool
    cores: int
    ram_gib: float
    gpu: str | None
    python: str
    torch: str | None

    def short(self) -> str:
        """The table's cell: the GPU (when one was used), the CPU, bf16, the cores."""
        bf16 = "bf16 native" if self.bf16_native else "bf16 emulated"
        gpu = f"{self.gpu}; host " if self.gpu else ""
        return f"{gpu}{self.cpu} · {bf16} · {self.cores} cores"

    def line(self) -> str:
        """The log's sentence: everything a reader needs to compare two figures."""
        bf16 = "native bf16" if self.bf16_native else "bf16 emulated"
        return (f"{self.cpu}, {self.cores} cores ({bf16}), {self.ram_gib:.0f} GiB RAM, "
                f"{self.gpu or 'no GPU'}; Python {self.python}, torch {self.torch or '?'}")


def describe() -> Machine:
    """This machine, now (torch's version and the GPU only when torch is imported already:
    the description never pays a torch import)."""
    info = host_info()
    torch = sys.modules.get("torch")
    gpu = None
    if torch is not None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    try:
        override = cpu_bf16_override()
    except ValueError:
        override = None
    return Machine(cpu=info["cpu_model"], cores=info["cpu_count"] or 1,
                   bf16_native=bf16_emulated_why(read_cpu_flags(), override) is None,
                   ram_gib=(info["ram_bytes"] or 0) / 1024**3, gpu=gpu,
                   python=info["python"], torch=info["torch"])
