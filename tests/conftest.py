"""Shared test settings: pinned terminal width so rich output is stable."""

import os

os.environ.setdefault("COLUMNS", "160")
os.environ.setdefault("NO_COLOR", "1")
