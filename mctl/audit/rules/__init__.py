"""The audit's rules, one module per family: pure functions from desired and actual state to findings.

Each returns OK findings for what it compared and problems for what differs;
`details["subject"]` names what a finding is about (a file, a block, a
partition) so history can follow it from run to run. No rule does I/O.
"""
