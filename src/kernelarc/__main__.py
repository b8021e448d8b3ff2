"""``python -m kernelarc``: the same CLI as the ``kernelarc`` command."""

from kernelarc.cli.main import app

app(prog_name="kernelarc")
