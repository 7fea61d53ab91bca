"""The folder of image definitions a site uses (Site.images_dir)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from mctl.errors import UsageError
from mctl.model.image import SoftwareImage


def load_image(path: Path) -> SoftwareImage:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read image {path}: {exc}") from None
    try:
        image = SoftwareImage.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{path}: {where}: {first['msg']}",
                         hint="see images/gb200-ubuntu24.04.yml for the format") from None
    if image.name != path.stem:
        raise UsageError(f"{path}: name {image.name!r} does not match the file name",
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
