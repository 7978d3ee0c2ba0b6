"""Startup: from the command to the dashboard's first frame and first sample on screen, and
headless's first lines, beside `import torch` and a bare training script as the floor.

Cases: startup.
"""
