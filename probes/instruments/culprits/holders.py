"""Who holds a tensor, in the user's terms: a walk up ``gc.get_referrers`` from a few new
tensors to the first holder that has a name.

Names come from a map built at the look (id of an object -> its name): the locals of the
training thread's frames in the user's code, the globals of the user's modules, the attributes
of the model's named submodules (``model.blocks.0.cache``), their hook dicts and hook
functions, the optimizer's state. An object's attribute (``Node.t``) and a function's closure
(``keep_output (train.py:40)``) are named where the walk meets them. Each level is one
``gc.get_referrers`` call for the whole frontier (one scan of the heap), the frontier is capped,
and the depth is bounded: the walk costs a few heap scans, whatever the heap holds.
"""

from __future__ import annotations

import gc
import linecache
import re
import sys
import types
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from probes.instruments.culprits.census import HOOK_DICTS
from probes.tools.frames import is_user_file, short_path, where

CONTAINERS = (list, dict, set, tuple, frozenset)
_SKIP_TYPES = (types.FrameType, types.ModuleType, type, types.CodeType)
_MODULE_SKIP = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                *HOOK_DICTS}


def holder_names(model: torch.nn.Module | None, optimizer: Any) -> dict[int, str]:
    """id(object) -> the name a user knows it by, for what the walk may meet."""
    names: dict[int, str] = {}
    for mod in list(sys.modules.values()):
        file = getattr(mod, "__file__", None)
        if not file or not is_user_file(file):
            continue
        lines = linecache.getlines(file)
        for name, value in list(vars(mod).items()):
            if not name.startswith("__") and not isinstance(value, _SKIP_TYPES):
                names.setdefault(id(value), f"`{name}` ({assigned_at(lines, name, file)})")
    frame = sys._getframe(1)
    while frame is not None:  # the training thread's stack: the loop's own locals
        code = frame.f_code
        if is_user_file(code.co_filename):
            fn = f"{code.co_qualname}()" if code.co_name != "<module>" else "the script"
            for name, value in frame.f_locals.items():
                if not isinstance(value, _SKIP_TYPES):
                    names.setdefault(id(value), f"`{name}` (a local of {fn}, "
                                                f"{where(code.co_filename, frame.f_lineno)})")
        frame = frame.f_back
    if model is not None:
        for mod_name, module in model.named_modules(prefix="model"):
            for attr, value in vars(module).items():
                if attr not in _MODULE_SKIP and not isinstance(value, _SKIP_TYPES):
                    names[id(value)] = f"`{mod_name}.{attr}`"
            for attr in HOOK_DICTS:
                hooks = getattr(module, attr, None) or {}
                kind = attr.strip("_").replace("_", " ").removesuffix("s")
                names[id(hooks)] = f"the {kind}s of {mod_name}"
                for fn in hooks.values():
                    names[id(fn)] = f"a {kind} {function_label(fn)} on {mod_name}"
    if optimizer is not None:
        state = getattr(optimizer, "state", None)
        if state is not None:
            names[id(state)] = f"{type(optimizer).__name__}.state"
            for per_param in list(state.values()):
                names[id(per_param)] = f"{type(optimizer).__name__}.state"
    return names


def assigned_at(lines: list[str], name: str, file: str) -> str:
    """"train.py:42, a global": the first top-level line that binds ``name``."""
    pattern = re.compile(rf"^{re.escape(name)}\s*(:|=[^=])")
    line = next((i for i, text in enumerate(lines, 1) if pattern.match(text)), None)
    return f"{where(file, line)}, a global" if line else f"a global of {short_path(file)}"


def class_label(cls: type) -> str:
    """"LeakInjector (trainer/leaks.py:24)": a class with where it is defined."""
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not file:
        return cls.__qualname__
    pattern = re.compile(rf"^\s*class\s+{re.escape(cls.__name__)}\b")
    line = next((i for i, text in enumerate(linecache.getlines(file), 1)
                 if pattern.match(text)), None)
    return f"{cls.__qualname__} ({where(file, line) if line else short_path(file)})"


def function_label(fn: Any) -> str:
    """"`keep_output` (train.py:40)" for a function (or a callable object's class)."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__func__", None), "__code__",
                                                    None)
    if code is None:
        return f"`{type(fn).__qualname__}`"
    return f"`{code.co_qualname}` ({where(code.co_filename, code.co_firstlineno)})"


def _attribute_of(owner: Any, child_ids: set[int], keys: dict[int, str]) -> str | None:
    """The attribute of ``owner`` that holds a child: read in its ``__dict__``, or the key
    the walk found in that dict when the dict itself was the child (a materialized one)."""
    try:
        attrs = vars(owner)
    except TypeError:
        return None
    if id(attrs) in child_ids:
        return keys.get(id(attrs))
    return next((k for k, v in list(attrs.items()) if id(v) in child_ids), None)


def _named_here(r: Any, child_ids: set[int], names: dict[int, str],
                keys: dict[int, str]) -> str | None:
    """The name of a referrer that ends the walk, if it has one."""
    if id(r) in names:
        return names[id(r)]
    if isinstance(r, types.FunctionType):  # a closure: the function with its file:line
        return f"the closure of {function_label(r)}"
    if isinstance(r, types.CellType) or isinstance(r, CONTAINERS):
        return None
    cls = type(r)
    attr = _attribute_of(r, child_ids, keys)
    if attr is not None:
        return f"attribute `{attr}` of {class_label(cls)}"
    return None


def find_holders(samples: Iterable[torch.Tensor], names: dict[int, str], *, depth: int = 6,
                 width: int = 256, ignore: Iterable[int] = ()) -> Counter[tuple[str, str]]:
    """How many of ``samples`` each named holder keeps: (holder, the container next to the
    tensors: "list", "dict", ...) -> count; ("", "") counts those with no holder found."""
    targets = list(samples)
    ignored = set(ignore) | {id(targets)}
    origin: dict[int, set[int]] = {id(t): {id(t)} for t in targets}  # node -> samples in it
    nearest: dict[int, str] = {}  # sample id -> type of its nearest container
    found: dict[int, str] = {}
    keys: dict[int, str] = {}  # id of a dict met on the way -> the key that led to it
    frontier = {id(t): t for t in targets}
    ignored.add(id(frontier))
    for _ in range(depth):
        if not frontier or len(found) == len(targets):
            break
        nodes = list(frontier.values())
        ignored.add(id(nodes))
        refs = gc.get_referrers(*nodes)
        ignored.add(id(refs))
        nxt: dict[int, Any] = {}
        for r in refs:
            if id(r) in ignored or isinstance(r, _SKIP_TYPES) or r is origin or r is found:
                continue
            child_ids = {id(x) for x in gc.get_referents(r)} & frontier.keys()
            sources = set().union(*(origin[c] for c in child_ids)) - found.keys()
            if not sources:
                continue
            for s in sources:
                if isinstance(r, CONTAINERS):
                    nearest.setdefault(s, type(r).__name__)
            if isinstance(r, dict):  # maybe an object's __dict__: remember which key
                key = next((k for k, v in list(r.items()) if id(v) in child_ids), None)
                if isinstance(key, str):
                    keys[id(r)] = key
            name = _named_here(r, child_ids, names, keys)
            if name is not None:
                for s in sources:
                    found[s] = name
            elif len(nxt) < width:
                origin.setdefault(id(r), set()).update(sources)
                nxt[id(r)] = r
        del refs, nodes
        frontier = nxt
        ignored.add(id(frontier))
    counts: Counter[tuple[str, str]] = Counter()
    for t in targets:
        counts[(found.get(id(t), ""), nearest.get(id(t), "") if id(t) in found else "")] += 1
    frontier.clear()
    return counts
