"""The folder of image definitions a site uses (Site.images_dir)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from mctl.errors import UsageError
from mctl.model.image import SoftwareImage

FORMAT_HINT = "see images/gb200-ubuntu24.04.yml for the format"


def load_image(path: Path) -> SoftwareImage:
    """An image definition, read by the inventory's rules (mctl.inventory.yamlsrc): no tags, no duplicate keys,
    no control or invisible characters, and no line breaks either (every value of an image is one line:
    packages, versions, kernel parameters); each problem names its file and line."""
    from mctl.inventory.yamlsrc import dotted, read_yaml

    doc = read_yaml(path, text_values=False, what="image definition")
    if doc.problems:
        raise doc.refusal(FORMAT_HINT)
    try:
        image = SoftwareImage.model_validate(doc.data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        line = doc.line_of(loc)
        raise UsageError(f"{path}{f':{line}' if line else ''}: {dotted(loc)}: {first['msg']}", hint=FORMAT_HINT) from None
    if image.name != path.stem:
        raise UsageError(f"{path}:{doc.line_of(('name',))}: name {image.name!r} does not match the file name",
                         hint=f"rename the file to {image.name}.yml or fix 'name:'")
    return image


class ImageCatalog:
    def __init__(self, folder: Path | None):
        if folder is None or not folder.is_dir():
            raise UsageError(f"no image folder {folder}" if folder else "the inventory sets no images_dir",
                             hint="set images_dir in mctl.yml to the folder of image definitions")
        self.folder = folder

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yml"))

    def get(self, name: str) -> SoftwareImage:
        path = self.folder / f"{name}.yml"
        if not path.is_file():
            raise UsageError(f"unknown image {name!r}", hint=f"known images: {', '.join(self.names()) or 'none'}")
        return load_image(path)
