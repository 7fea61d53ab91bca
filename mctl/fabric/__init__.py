"""NVLink partitions (planner, NMX-Manager client) and the IMEX domains that follow them."""
