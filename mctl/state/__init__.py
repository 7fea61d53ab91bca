"""The state directory: atomic files, per-rack locks and timestamped snapshots.

Everything mctl remembers between runs lives under one directory (default
/var/lib/mctl, `--state-dir`, MCTL_STATE_DIR). Other modules should go through
these helpers so every write is atomic and every lock is named after what it
protects.
"""

from mctl.state.files import DamagedState, atomic_write, check_shape, ensure_dir, read_json, read_text, write_json
from mctl.state.lock import LockBusy, file_lock, lock_holder, rack_lock, rack_lock_path, rack_locks
from mctl.state.snapshots import Snapshot, latest_snapshot, list_snapshots, load_snapshot, save_snapshot

__all__ = [
    "DamagedState", "atomic_write", "check_shape", "ensure_dir", "read_json", "read_text", "write_json",
    "LockBusy", "file_lock", "lock_holder", "rack_lock", "rack_lock_path", "rack_locks",
    "Snapshot", "latest_snapshot", "list_snapshots", "load_snapshot", "save_snapshot",
]
