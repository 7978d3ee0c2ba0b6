"""Frameworks: MemtopCallback's per-step cost inside the Hugging Face Trainer and the Lightning
Trainer, the same train()/fit() with and without it, interleaved.

Cases: framework_overhead.
"""
