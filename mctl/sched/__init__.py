"""Schedulers on top of the racks: Slurm (slurm/) and Kubernetes (k8s/).

Each renders its configuration from the site model and the facts mctl gathered
(pure functions with golden tests) and has one adapter module that acts.
"""
