"""Out-of-band access to the trays' BMCs over Redfish (docs/bmc.md)."""
