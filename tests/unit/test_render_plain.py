"""Off a terminal, tables are aligned plain columns and rich is never imported for them."""

from __future__ import annotations

import subprocess
import sys


def test_plain_table_and_lines_without_rich(processes):
    code = (
        "import sys\n"
        "from mctl.cli import render\n"
        "render.table('rack r1', ('tray', 'GPUs', 'findings'), [('r1-tray01', '4/4', 'ok'), ('r1-tray10', '3/4', 'gpu.count')])\n"
        "render.line('2 trays')\n"
        "print('rich loaded' if 'rich' in sys.modules else 'no rich')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "rack r1",
        "tray       GPUs  findings",
        "---------  ----  ---------",
        "r1-tray01  4/4   ok",
        "r1-tray10  3/4   gpu.count",
        "2 trays",
        "no rich",
    ]
