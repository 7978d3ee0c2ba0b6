"""Step cost: what memtop adds to a training step, in process and as separate runs, on CPU and
at GPU step lengths; the per-step sample and the Monitor's own fixed cost.

Cases: overhead, step_overhead, monitor_overhead, monitor_fixed_cost, cuda_hot_path,
sampler_cost, sampler_in_run, workers_sampler (synthetic_step.py is step_overhead's sweep model).
"""
