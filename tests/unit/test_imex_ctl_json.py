"""The lab's nvidia-imex-ctl writes -N -j without the json module; it must print what json.dumps would."""

from __future__ import annotations

import json

from mctl.lab.emulators import imex_ctl


def test_json_writer_matches_json_dumps():
    samples = [
        {"nodes": {"0": {"status": "READY", "host": "127.0.0.1", "hostName": "", "changed": False,
                         "connections": {"0": {"host": "127.0.0.1", "status": "CONNECTED", "changed": False}},
                         "version": "570.172"}}, "timestamp": "11/29/2026 23:59:59.000", "status": "UP"},
        {"a": [], "b": {}, "c": [1, 2.5, None, True], "d": "quote \" backslash \\ tab \t nl \n é € 😀 \x01 \x7f"},
    ]
    for value in samples:
        assert imex_ctl._json(value) == json.dumps(value, indent=2)


def test_render_json_parses_back():
    view = {"timestamp": "t", "status": "UP", "local": {"index": 0, "state": "READY"},
            "nodes": [{"status": "READY", "host": "127.0.0.1", "hostName": "a", "version": "v", "row": ["C", "C"]},
                      {"status": "READY", "host": "127.0.0.2", "hostName": "b", "version": "v", "row": ["C", "C"]}]}
    data = json.loads(imex_ctl.render_json(view))
    assert list(data) == ["nodes", "timestamp", "status"] and data["nodes"]["1"]["connections"]["0"]["host"] == "127.0.0.1"
