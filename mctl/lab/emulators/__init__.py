"""Emulators of the parts of a GB200 rack the lab cannot run for real (GPUs via nvidia-smi, ...).

Each emulator is a standalone stdlib-only script that the lab installs inside a tray;
mctl imports the same module for its pure helpers and golden tests.
"""
