"""Image definitions (images/*.yml) are read by the inventory's rules (issue 27): no tags, no duplicate keys,
no control or invisible characters and no line breaks in a value; each refusal names its file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from mctl.errors import UsageError
from mctl.images.catalog import ImageCatalog, load_image

REPO = Path(__file__).resolve().parents[2]
IMAGE = (REPO / "images" / "gb200-ubuntu24.04.yml").read_text()


def test_every_shipped_image_loads():
    catalog = ImageCatalog(REPO / "images")
    assert catalog.names() and all(catalog.get(name).name == name for name in catalog.names())


def _refusal(tmp_path: Path, text: str) -> UsageError:
    path = tmp_path / "gb200-ubuntu24.04.yml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(UsageError) as info:
        load_image(path)
    return info.value


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.split("\n"), start=1) if needle in line)


@pytest.mark.parametrize("old,new,needle,words", [
    ('version: "570.148.08"', "version: !!str 570.148.08", "!!str", "components.nvidia_driver.version: YAML tag '!!str'"),
    ('version: "570.148.08"', "version: !!binary NTcw", "!!binary", "YAML tag '!!binary'"),
    ("  nvidia_driver:\n", "  nvidia_driver: !component\n", "!component", "components.nvidia_driver: YAML tag"),
    ('    version: "12.8"\n', '    version: "12.8"\n    version: "12.9"\n', '"12.9"', "components.cuda.version: duplicate"),
    ('version: "570.148.08"', 'version: "570\\0"', 'version: "570\\0"', "U+0000"),
    ("packages: [cuda-toolkit-12-8=12.8.1-1]", 'packages: ["cuda-toolkit-12-8=12.8.1-1\\nx"]', "cuda-toolkit",
     "components.cuda.packages[0]: the value"),
    ("description: GB200 NVL72 compute tray, Ubuntu 24.04, driver branch 570", 'description: "GB200\\u202e"',
     "description", "description: the value 'GB200\\u202e' holds U+202E"),
    ("description: GB200", "description: GB\u2028200", "description", "U+2028 (LINE SEPARATOR) at column"),
    ("description: GB200", "descr\udcffiption: GB200", "descr", "not UTF-8"),
    ("    hold: true\n", "    hold: perhaps\n", "perhaps", "components.nvidia_driver.hold: Input should be a valid boolean"),
    ("    hold: true\n", "    hodl: true\n", "hodl", "components.nvidia_driver.hodl: Extra inputs"),
    ("name: gb200-ubuntu24.04", "name: gb300", "name: gb300", "does not match the file name"),
], ids=["tag-str", "tag-binary", "tag-on-mapping", "duplicate-key", "nul", "newline-in-package", "bidi", "raw-separator",
        "not-utf8", "wrong-type", "unknown-key", "name"])
def test_a_bad_image_definition_names_its_file_and_line(tmp_path, old, new, needle, words):
    assert old in IMAGE
    text = IMAGE.replace(old, new, 1)
    err = _refusal(tmp_path, text)
    assert f"gb200-ubuntu24.04.yml:{_line(text, needle)}:" in err.message and words in err.message, err.message
    assert err.hint


def test_an_alias_bomb_in_an_image_is_refused_quickly(tmp_path):
    bomb = "build:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  {n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcde", "bcdef"))
    assert "more than 100,000 values" in _refusal(tmp_path, IMAGE + bomb).message
