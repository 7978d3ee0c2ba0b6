"""Name the culprit of a leak: which tensors, hooks, lines of host code or unreachable cycles
grow, and what holds them, in the user's terms. Runs only at a leak alert or on request.

    from probes.instruments.culprits import CulpritFinder
    Monitor(model, opt)           # the finder is one of the default hooks (leak_watch=True)
    # the `w` key, or a viewer's who_holds request, starts a look by hand; each look writes
    # one leak_culprit event (probes/records/culprits.py has its sentence)

Modules: census (live tensors by group, hook counts), holders (the referrer walk and the names
it ends on), hostgrowth (tracemalloc between looks, gc-off garbage), finder (the StepHook).
"""

from __future__ import annotations

from probes.tools.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("Census", "TensorGroup", "take_census", "hook_counts"), ".census"),
    **dict.fromkeys(("find_holders", "holder_names", "function_label"), ".holders"),
    **dict.fromkeys(("HostWindow", "unreachable_now", "group_by_user_line"), ".hostgrowth"),
    **dict.fromkeys(("CulpritFinder", "hook_count_total"), ".finder"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
