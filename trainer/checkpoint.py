"""memtop's weights file: a small header that says what model it is, and the state_dict.

Saved by `memtop train` at the end of a run (probes/runfolder/ ``weights.pt``), read by
`memtop infer --weights RUN`. Reading uses ``torch.load(weights_only=True)``: tensors, dicts,
lists and plain values only, never arbitrary pickled objects (docs/ARCHITECTURE.md). The header is
checked before any tensor is used, so a foreign or mismatched file is refused in one sentence.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.records.errors import MemtopError
from probes.runfolder import atomic_path

if TYPE_CHECKING:
    import torch

    from trainer.model import GPT, GPTConfig

FORMAT = "memtop-weights"
VERSION = 1
_SHAPE_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")


class CheckpointError(MemtopError, ValueError):
    """Not a memtop weights file, or one that does not fit the model asked for (exit 2)."""


def save_weights(model: GPT, path: Path, **info: Any) -> int:
    """Write header + state_dict atomically; returns the file's size in bytes."""
    import torch

    from probes.counters.host import memtop_version

    header = {"format": FORMAT, "version": VERSION, "memtop": memtop_version(),
              "model": dataclasses.asdict(model.config), **info}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        torch.save({"memtop": header, "state_dict": state}, tmp)
    return Path(path).stat().st_size


def read_weights(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(header, state_dict) of a memtop weights file, on the CPU; CheckpointError otherwise."""
    import pickle

    import torch

    path = Path(path)
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the refusal says it
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} is not a memtop weights file: it holds pickled objects "
                              "other than tensors and plain values, which memtop never "
                              "unpickles (torch.load weights_only=True)") from None
    except Exception as exc:  # noqa: BLE001 - any file: torch's unpickler raises KeyError,
        # IndexError, UnicodeDecodeError, struct.error... on text or junk (issue 44 item 5)
        raise CheckpointError(f"{path} is not a memtop weights file (torch.load could not read "
                              f"it: {type(exc).__name__})") from None
    header = data.get("memtop") if isinstance(data, dict) else None
    state = data.get("state_dict") if isinstance(data, dict) else None
    if not isinstance(header, dict) or header.get("format") != FORMAT or \
            not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a memtop weights file (no memtop header); "
                              "`memtop train` writes weights.pt into its run folder")
    if header.get("version") != VERSION:
        raise CheckpointError(f"{path} is memtop weights format {header.get('version')!r}; "
                              f"this memtop reads format {VERSION}")
    try:
        config = header_config(header)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: its header's model is not valid "
                              f"({type(exc).__name__}: {exc})") from None
    check_state(config, state, path)
    return header, state


def header_config(header: dict[str, Any]) -> GPTConfig:
    from trainer.model import GPTConfig

    names = {f.name for f in dataclasses.fields(GPTConfig)}
    model = header["model"]
    for key in _SHAPE_KEYS:  # GPTConfig checks values, not types: 16.0 or True would pass
        if key in model and (type(model[key]) is not int):
            raise TypeError(f"{key} is {model[key]!r}, not an integer")
    return GPTConfig(**{k: v for k, v in model.items() if k in names})


def check_state(config: GPTConfig, state: dict[str, Any], path: Path) -> None:
    """The state_dict's names and shapes are those of GPT(config); built on the meta device,
    so nothing is allocated or computed."""
    import torch

    from trainer.model import GPT

    odd = next((k for k, v in state.items() if not isinstance(v, torch.Tensor)), None)
    if odd is not None:  # load_state_dict would fail on it later, on the runner's thread
        raise CheckpointError(f"{path}: its state_dict's {str(odd)!r} is a "
                              f"{type(state[odd]).__name__}, not a tensor")
    got = {k: tuple(v.shape) for k, v in state.items()}
    if config.n_layer > len(got):  # every block has tensors: no need to build a huge model
        raise CheckpointError(f"{path} does not match its own header's model ({config.n_layer} "
                              f"layers, {len(got)} tensors)")
    try:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    except Exception as exc:  # noqa: BLE001 - the header's shape is the user's file's word
        raise CheckpointError(f"{path}: its header's model is not valid "
                              f"({type(exc).__name__}: {exc})") from None
    missing = sorted(set(expected) - set(got))
    extra = sorted(str(k) for k in set(got) - set(expected))  # a key may be any plain value
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise CheckpointError(f"{path} does not match its own header's model "
                              f"({len(missing)} missing, {len(extra)} unexpected tensors; "
                              f"{what})")
    for name, shape in expected.items():
        if got[name] != shape:
            raise CheckpointError(f"{path}: {name} is {list(got[name])}, the header's model "
                                  f"needs {list(shape)}")
        tensor = state[name]
        if not tensor.is_floating_point() or tensor.is_sparse or tensor.is_meta:
            raise CheckpointError(f"{path}: {name} is a {tensor.dtype} tensor"
                                  f"{' (sparse)' if tensor.is_sparse else ''}"
                                  f"{' on the meta device' if tensor.is_meta else ''}; "
                                  "memtop's model needs dense floating-point weights")
