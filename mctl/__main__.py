from mctl.cli.main import run

run()
