"""mctl: Mission Control-style management for NVIDIA GB200/GB300 NVL72 racks."""

__version__ = "0.1.0"
