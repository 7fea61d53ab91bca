"""Load software image definitions and compare them with what trays report.

Layer 1, like the inventory: it reads the site's image folder and judges versions it is
handed (model and errors only); reading the trays and BMCs to compare is
mctl.audit.image_diff's (docs/decisions.md D59)."""

from mctl.images.catalog import ImageCatalog, load_image
from mctl.images.drift import image_drift

__all__ = ["ImageCatalog", "load_image", "image_drift"]
