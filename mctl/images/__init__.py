"""Load software image definitions and compare them with what trays report."""

from mctl.images.catalog import ImageCatalog, load_image
from mctl.images.drift import image_drift

__all__ = ["ImageCatalog", "load_image", "image_drift"]
